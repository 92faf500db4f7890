// The tab's alert thresholds panel: the thresholds saved at the log directory's root (or the defaults), one row
// per rule to edit, and Save, which sends every rule whole to `POST /thresholds`, the plugin's only write.
//
// Running monitors pick the saved file up within one flush. The server validates (`Thresholds.from_dict`); its
// message is shown next to the form and the field it names is marked. Where the log directory cannot be written
// (`writable: false`) the panel says why and saving is off. Everything from the server reaches the DOM through
// textContent.
//
// Example:
//   const {toggle, section} = buildThresholdsPanel();
//   header.append(toggle); app.append(section);
//   onThresholdsChange((doc) => redraw(doc.thresholds));
//   await loadThresholds();                     // then on every poll

import {ROUTE, el, errorText, short} from "./dom.js";

const SAVE_HEADERS = {"Content-Type": "application/json", "X-Rnnmon-Request": "save"};
const REACH_LEVELS = 3; // a monitor looks for the file in its log directory and up to three folders above

// What each rule measures, in the form's words; `unit` is the unit of its alerts' value and threshold.
export const RULES = {
  gpu_util_low: {label: "GPU utilization low", unit: "%", help: "Per GPU: mean utilization over the window.",
    fire: ["pct", "below", "%"], resolve: ["resolve_pct", "back at", "%"]},
  input_wait_high: {label: "Input wait high", unit: "%", help: "Input wait as a share of step time.",
    fire: ["pct", "above", "%"], resolve: ["resolve_pct", "back at", "%"]},
  idle_gap: {label: "Idle gap", unit: " s", help: "A GPU (without one: training) idle at a stretch.",
    fire: ["min_s", "at least", "s"]},
  step_time_high: {label: "Step time high", unit: " ms", help: "Median step time per batch.",
    fire: ["ms", "above", "ms"], resolve: ["resolve_ms", "back at", "ms"]},
  step_time_regression: {label: "Step time regression", unit: "×",
    help: "Median step time against the median of the first steps.",
    fire: ["ratio", "above", "×"], resolve: ["resolve_ratio", "back at", "×"],
    more: [["baseline_steps", "baseline: first", "steps", 1]]},
  gpu_memory_high: {label: "GPU memory high", unit: "%", help: "Per GPU: memory used, of the total.",
    fire: ["pct", "above", "%"], resolve: ["resolve_pct", "back at", "%"]},
  gpu_throttled: {label: "GPU throttled", unit: "%", help: "Per GPU: share of the time clocks were held back.",
    fire: ["pct", "above", "%"], resolve: ["resolve_pct", "back at", "%"]},
};

const panel = {doc: null, signature: "", dirty: false, runs: [], listeners: []};
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

export function noteRuns(runs) {
  const signature = runs.map((run) => run.name).join("\n");
  if (signature === panel.runs.join("\n")) return;
  panel.runs = runs.map((run) => run.name);
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
  const deep = panel.runs.filter((name) => name.split("/").length > REACH_LEVELS);
  ui.where.replaceChildren(
    doc.source === "file" ? "Saved in " : `No thresholds saved ${doc.writable ? "yet; they would go to " : "at "}`,
    path,
    `. Running monitors whose log directory is this folder or up to ${REACH_LEVELS} folders below switch to ` +
    "saved thresholds within one flush (about 2 s), unless a nearer thresholds file applies or the monitor " +
    "has watch_thresholds=False. Alerts already recorded keep the thresholds they fired with.",
    ...(deep.length ? [el("span", "rm-th-warn", ` Too deep to be reached: ${deep.join(", ")}.`)] : []));
  const notes = [];
  if (!doc.writable) notes.push(["Saving is off", `${doc.reason}. Pass thresholds= to rnnmon.UtilizationMonitor ` +
    "instead, or write rnnmon_thresholds.json next to the runs by hand."]);
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

function ruleRow(rule, values) {
  const spec = RULES[rule] || {label: rule, help: ""};
  const row = el("tr", values.enabled === false ? "rm-th-off" : "");
  row.dataset.rule = rule;
  const name = el("td", "rm-th-rule");
  name.append(el("div", "rm-th-label", spec.label), el("code", "rm-th-code", rule));
  if (spec.help) name.title = spec.help;
  const used = new Set(["enabled"]);
  const cell = (field) => {
    const td = el("td");
    if (field && field[0] in values) {
      td.append(numberField(rule, field, values[field[0]], spec.label));
      used.add(field[0]);
    }
    return td;
  };
  const on = el("td", "rm-th-on");
  if ("enabled" in values) {
    const box = el("input", "rm-switch");
    box.type = "checkbox";
    box.checked = Boolean(values.enabled);
    box.dataset.field = `${rule}.enabled`;
    box.setAttribute("aria-label", `${spec.label}: on`);
    box.addEventListener("change", () => row.classList.toggle("rm-th-off", !box.checked));
    on.append(box);
  }
  const fire = cell(spec.fire);
  const resolve = cell(spec.resolve);
  const span = cell(["for_s", "over", "s"]);
  const more = el("td", "rm-th-more");
  for (const field of spec.more || []) {
    if (field[0] in values) more.append(numberField(rule, field, values[field[0]], spec.label));
    used.add(field[0]);
  }
  for (const [key, value] of Object.entries(values)) {
    if (used.has(key)) continue;
    if (Array.isArray(value)) more.append(choiceField(rule, key, value));
    else if (typeof value === "boolean") more.append(flagField(rule, key, value));
    else more.append(numberField(rule, [key, key, ""], value, spec.label));
  }
  if (!resolve.childNodes.length) resolve.append(el("span", "rm-muted", "when it ends"));
  row.append(name, on, fire, resolve, span, more);
  return row;
}

function numberField(rule, [key, before, unit, step], value, label) {
  const wrap = el("label", "rm-field");
  const input = el("input", "rm-number");
  input.type = "number";
  input.step = step ? String(step) : "any";
  input.inputMode = step ? "numeric" : "decimal";
  input.value = String(value);
  input.dataset.field = `${rule}.${key}`;
  input.setAttribute("aria-label", `${label}: ${before} (${unit || key})`);
  wrap.append(el("span", "rm-field-before", before), input);
  if (unit) wrap.append(el("span", "rm-field-unit", unit));
  return wrap;
}

function flagField(rule, key, value) {
  const wrap = el("label", "rm-field");
  const box = el("input");
  box.type = "checkbox";
  box.checked = value;
  box.dataset.field = `${rule}.${key}`;
  wrap.append(box, el("span", "", key));
  return wrap;
}

function choiceField(rule, key, chosen) {
  const wrap = el("div", "rm-choices");
  wrap.dataset.field = `${rule}.${key}`;
  wrap.append(el("span", "rm-field-before", `${key}:`));
  const names = [...new Set([...(panel.doc?.defaults?.[rule]?.[key] || []), ...chosen])];
  for (const name of names) {
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
