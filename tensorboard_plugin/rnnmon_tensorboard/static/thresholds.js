// The tab's alert thresholds panel: the thresholds saved at the log directory's root (or the defaults), one row
// per rule to edit, and Save, which sends every rule whole to `POST /thresholds`, the plugin's only write.
//
// The rows are built from the rules' schema the server sends with the thresholds (`rules`: each rule's label,
// unit and keys with their kind, bounds, column and words), which is also where the rest of the tab finds a
// rule's label and unit (`ruleSpec`). Running monitors pick the saved file up within one flush. The server
// validates (`Thresholds.from_dict`); its message is shown next to the form and the field it names is marked.
// Where the log directory cannot be written (`writable: false`) the panel says why and saving is off. Everything
// from the server reaches the DOM through textContent.
//
// Example:
//   const {toggle, section} = buildThresholdsPanel();
//   header.append(toggle); app.append(section);
//   onThresholdsChange((doc) => redraw(doc.thresholds));
//   await loadThresholds();                     // then on every poll

import {ROUTE, el, errorText} from "./dom.js";

const SAVE_HEADERS = {"Content-Type": "application/json", "X-Rnnmon-Request": "save"};
const COLUMNS = ["on", "fire", "resolve", "window", "more"]; // the form's columns after the rule: each key's `role`

const panel = {doc: null, signature: "", dirty: false, deep: [], listeners: []};
const ui = {};

export function buildThresholdsPanel() {
  ui.toggle = el("button", "rm-button rm-th-toggle", "Alert thresholds");
  ui.toggle.id = "rm-thresholds-toggle";
  ui.toggle.setAttribute("aria-expanded", "false");
  ui.toggle.addEventListener("click", () => showPanel(ui.section.hidden));
  ui.section = el("section", "rm-th");
  ui.section.id = "rm-thresholds";
  ui.section.hidden = true;
  const head = el("div", "rm-th-head");
  ui.source = el("span", "rm-th-source");
  head.append(el("h2", "rm-th-title", "Alert thresholds"), ui.source);
  ui.where = el("p", "rm-th-where");
  ui.notice = el("div", "rm-th-notice");
  ui.notice.hidden = true;
  ui.fields = el("fieldset", "rm-th-fields");
  ui.table = el("table", "rm-th-table");
  ui.fields.append(ui.table);
  ui.save = el("button", "rm-button rm-button-primary", "Save");
  ui.save.type = "submit";
  ui.save.id = "rm-thresholds-save";
  const discard = ui.discard = el("button", "rm-button", "Discard changes");
  discard.type = "button";
  discard.addEventListener("click", () => fillForm(panel.doc.thresholds, false));
  const defaults = ui.defaults = el("button", "rm-button", "Defaults");
  defaults.type = "button";
  defaults.title = "Fill in rnnmon's defaults (saved only with Save)";
  defaults.addEventListener("click", () => fillForm(panel.doc.defaults, true));
  ui.status = el("span", "rm-th-status");
  ui.status.id = "rm-thresholds-status";
  ui.status.setAttribute("role", "status");
  const actions = el("div", "rm-th-actions");
  actions.append(ui.save, discard, defaults, ui.status);
  ui.form = el("form", "rm-th-form");
  ui.form.noValidate = true; // the server validates; its messages are the ones shown
  ui.form.append(ui.fields, actions);
  ui.form.addEventListener("submit", (event) => {
    event.preventDefault();
    save();
  });
  ui.form.addEventListener("input", () => {
    panel.dirty = true;
    clearProblem();
    setStatus("", "Unsaved changes");
  });
  ui.section.append(head, ui.where, ui.notice, ui.form);
  return {toggle: ui.toggle, section: ui.section};
}

export function showPanel(open) {
  ui.section.hidden = !open;
  ui.toggle.setAttribute("aria-expanded", String(open));
  ui.toggle.classList.toggle("rm-button-active", open);
}

export function onThresholdsChange(listener) {
  panel.listeners.push(listener);
}

// The thresholds now saved (or the defaults) as the server last answered, or null before the first answer.
export function currentThresholds() {
  return panel.doc?.thresholds || null;
}

// The rule `rule` as the server describes it: its label, help, unit (after its alerts' values) and keys.
export function ruleSpec(rule) {
  const rules = panel.doc?.rules;
  return rules && Object.hasOwn(rules, rule) ? rules[rule] : {label: rule, help: "", unit: "", keys: []};
}

export function noteRuns(runs) {
  const deep = runs.filter((run) => !run.thresholds_reach).map((run) => run.name);
  if (deep.join("\n") === panel.deep.join("\n")) return;
  panel.deep = deep;
  if (panel.doc) describeSource();
}

export async function loadThresholds() {
  let doc;
  try {
    const response = await fetch(ROUTE("thresholds"));
    if (!response.ok) throw new Error(errorText(await response.text()) || `${response.status}`);
    doc = await response.json();
  } catch (error) {
    if (!panel.doc) setStatus("error", `The thresholds cannot be read: ${error.message || error}`);
    return;
  }
  accept(doc, false);
}

function accept(doc, saved) {
  const signature = JSON.stringify(doc);
  if (signature === panel.signature) return;
  const changed = JSON.stringify(doc.thresholds) !== JSON.stringify(panel.doc?.thresholds);
  panel.doc = doc;
  panel.signature = signature;
  describeSource();
  if (!panel.dirty || saved) fillForm(doc.thresholds, false);
  else if (changed) setStatus("", "The saved thresholds changed meanwhile; Discard changes shows them.");
  for (const control of [ui.fields, ui.save, ui.discard, ui.defaults]) control.disabled = !doc.writable;
  if (changed) panel.listeners.forEach((listener) => listener(doc));
}

function describeSource() {
  const doc = panel.doc;
  ui.source.textContent = doc.source === "file" ? "saved file" : "defaults";
  ui.source.className = `rm-th-source rm-th-source-${doc.source}`;
  const path = el("code", "", doc.path || "(none)");
  ui.where.replaceChildren(
    doc.source === "file" ? "Saved in " : `No thresholds saved ${doc.writable ? "yet; they would go to " : "at "}`,
    path,
    `. Running monitors whose log directory is this folder or up to ${doc.levels_up} folders below switch to ` +
    "saved thresholds within one flush (about 2 s), unless a nearer thresholds file applies or the monitor " +
    "has watch_thresholds=False. Alerts already recorded keep the thresholds they fired with.",
    ...(panel.deep.length ? [el("span", "rm-th-warn", ` Too deep to be reached: ${panel.deep.join(", ")}.`)] : []));
  const notes = [];
  if (!doc.writable) notes.push(["Saving is off", `${doc.reason}. Pass thresholds= to rnnmon.UtilizationMonitor ` +
    `instead, or write ${doc.file_name} next to the runs by hand.`]);
  if (doc.error) notes.push(["Saved file not used", doc.error]);
  ui.notice.hidden = !notes.length;
  ui.notice.replaceChildren(...notes.map(([title, text]) => {
    const line = el("p", "");
    line.append(el("strong", "", `${title}: `), text);
    return line;
  }));
}

// --- the form ----------------------------------------------------------------------------------------------
function fillForm(thresholds, dirty) {
  const head = el("tr");
  for (const title of ["Rule", "On", "Fires when", "Resolves when", "Window", "More"]) head.append(el("th", "", title));
  const rows = Object.entries(thresholds).map(([rule, values]) => ruleRow(rule, values));
  const thead = el("thead");
  thead.append(head);
  const tbody = el("tbody");
  tbody.append(...rows);
  ui.table.replaceChildren(thead, tbody);
  panel.dirty = dirty;
  clearProblem();
  setStatus("", dirty ? "Unsaved changes" : "");
}

// A rule's row: each key's field in the column of its `role`, in the server's words and units.
function ruleRow(rule, values) {
  const spec = ruleSpec(rule);
  const off = spec.keys.some((key) => key.role === "on" && values[key.key] === false);
  const row = el("tr", off ? "rm-th-off" : "");
  row.dataset.rule = rule;
  const name = el("td", "rm-th-rule");
  name.append(el("div", "rm-th-label", spec.label), el("code", "rm-th-code", rule));
  if (spec.help) name.title = spec.help;
  const cells = {on: el("td", "rm-th-on"), fire: el("td"), resolve: el("td"), window: el("td"),
    more: el("td", "rm-th-more")};
  for (const key of spec.keys) {
    if (key.key in values) cells[key.role].append(field(rule, key, values[key.key], spec.label, row));
  }
  if (!cells.resolve.childNodes.length) cells.resolve.append(el("span", "rm-muted", "when it ends"));
  row.append(name, ...COLUMNS.map((role) => cells[role]));
  return row;
}

function field(rule, key, value, label, row) {
  if (key.kind === "flag") return switchField(rule, key, value, label, row);
  if (key.kind === "names") return choiceField(rule, key, value);
  return numberField(rule, key, value, label);
}

function switchField(rule, key, value, label, row) {
  const box = el("input", "rm-switch");
  box.type = "checkbox";
  box.checked = Boolean(value);
  box.dataset.field = `${rule}.${key.key}`;
  box.setAttribute("aria-label", `${label}: ${key.words}`);
  if (key.role === "on") box.addEventListener("change", () => row.classList.toggle("rm-th-off", !box.checked));
  return box;
}

// A number's field; its fixed bounds (not those that are another key's value) limit the spinner. The server still
// checks them all.
function numberField(rule, key, value, label) {
  const integer = key.kind === "integer";
  const wrap = el("label", "rm-field");
  const input = el("input", "rm-number");
  input.type = "number";
  input.step = integer ? "1" : "any";
  input.inputMode = integer ? "numeric" : "decimal";
  if (typeof key.low === "number") input.min = String(key.low);
  if (typeof key.high === "number") input.max = String(key.high);
  input.value = String(value);
  input.dataset.field = `${rule}.${key.key}`;
  input.setAttribute("aria-label", `${label}: ${key.words} (${key.unit || key.key})`);
  wrap.append(el("span", "rm-field-before", key.words), input);
  if (key.unit) wrap.append(el("span", "rm-field-unit", key.unit));
  return wrap;
}

function choiceField(rule, key, chosen) {
  const wrap = el("div", "rm-choices");
  wrap.dataset.field = `${rule}.${key.key}`;
  wrap.append(el("span", "rm-field-before", `${key.words}:`));
  for (const name of key.choices) {
    const option = el("label", "rm-choice");
    const box = el("input");
    box.type = "checkbox";
    box.value = name;
    box.checked = chosen.includes(name);
    option.append(box, el("span", "", name));
    wrap.append(option);
  }
  return wrap;
}

// Every rule, whole: the server checks each group's numbers against each other (resolve vs fire).
function readForm() {
  const out = {};
  for (const row of ui.table.querySelectorAll("tbody tr[data-rule]")) {
    const group = {};
    for (const input of row.querySelectorAll("input[data-field]")) {
      const key = input.dataset.field.split(".")[1];
      if (input.type === "checkbox") {
        group[key] = input.checked;
        continue;
      }
      const raw = input.value.trim();
      if (raw === "" || input.validity.badInput || !Number.isFinite(Number(raw))) {
        return {problem: `${input.dataset.field} must be a number`, field: input};
      }
      group[key] = Number(raw);
    }
    for (const choices of row.querySelectorAll(".rm-choices[data-field]")) {
      const key = choices.dataset.field.split(".")[1];
      group[key] = [...choices.querySelectorAll("input:checked")].map((box) => box.value);
    }
    out[row.dataset.rule] = group;
  }
  return {thresholds: out};
}

async function save() {
  const form = readForm();
  clearProblem();
  if (form.problem) {
    showProblem(form.problem);
    return;
  }
  ui.save.disabled = true;
  setStatus("", "Saving…");
  try {
    const headers = {...SAVE_HEADERS, "X-Rnnmon-Version": panel.doc?.version ?? "none"};
    const response = await fetch(ROUTE("thresholds"), {method: "POST", headers,
      body: JSON.stringify(form.thresholds)});
    const text = await response.text();
    if (response.status === 409 && /changed elsewhere/.test(text)) {
      showProblem("Not saved: the thresholds changed elsewhere: reload them, then save again.");
      return;
    }
    if (!response.ok) {
      showProblem(errorText(text) || `${response.status} ${response.statusText}`);
      return;
    }
    accept(JSON.parse(text), true);
    const when = new Date().toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", second: "2-digit"});
    setStatus("ok", `Saved at ${when}. Running monitors switch within about 2 s.`);
  } catch (error) {
    showProblem(`Not saved: ${error.message || error}`);
  } finally {
    ui.save.disabled = !panel.doc?.writable;
  }
}

function showProblem(message) {
  setStatus("error", message);
  const named = /\b([a-z_]+)\.([a-z_]+)\b/.exec(message);
  const input = named && ui.table.querySelector(`[data-field="${CSS.escape(`${named[1]}.${named[2]}`)}"]`);
  const row = input?.closest("tr") || (named && ui.table.querySelector(`tr[data-rule="${CSS.escape(named[1])}"]`));
  if (!row) return;
  row.classList.add("rm-th-invalid");
  if (input) {
    input.setAttribute("aria-invalid", "true");
    input.focus();
  }
  const note = el("tr", "rm-th-problem");
  const td = el("td", "", message);
  td.colSpan = 6;
  note.append(td);
  row.after(note);
}

function clearProblem() {
  ui.table.querySelectorAll(".rm-th-problem").forEach((node) => node.remove());
  ui.table.querySelectorAll(".rm-th-invalid").forEach((node) => node.classList.remove("rm-th-invalid"));
  ui.table.querySelectorAll("[aria-invalid]").forEach((node) => node.removeAttribute("aria-invalid"));
}

function setStatus(kind, text) {
  ui.status.className = `rm-th-status${kind ? ` rm-th-${kind}` : ""}`;
  ui.status.textContent = text;
}
