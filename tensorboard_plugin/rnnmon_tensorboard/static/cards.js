// The tab's cards and lists: a card per selected run (status, verdict, tiles, its top findings and alerts) and the
// alerts of the runs shown (the workers of a multi-worker job are in workers.js). Data from runs (names, findings,
// alert messages) reaches the DOM only through textContent.
//
// Example:
//   drawRunCards(section, selected, results);   // selected: /runs entries; results: run → {timeline, summary}
//   drawAlerts(section, selected, results);

import {ALERT_LIMIT, el, fixed, pct, short} from "./dom.js";
import {ruleSpec} from "./thresholds.js";

const STATUS_TEXT = {live: "live", stalled: "no new data", finished: "finished", failed: "failed",
  interrupted: "interrupted", terminated: "terminated", aborted: "aborted", unknown: "unknown"};

// A card per run in `runs`, side by side, from its result ({timeline, summary}, {error} or none yet).
export function drawRunCards(section, runs, results) {
  section.style.gridTemplateColumns = `repeat(${Math.max(1, runs.length)}, minmax(0, 1fr))`;
  section.replaceChildren(...runs.map((run) => card(run, results.get(run.run))));
}

function card(run, result) {
  const node = el("article", "rm-card");
  node.dataset.run = run.run;
  const head = el("div", "rm-card-head");
  const status = el("span", `rm-status rm-status-${run.status}`, STATUS_TEXT[run.status] || run.status);
  status.title = run.status === "stalled"
    ? `Still marked running, but nothing was written for ${Math.round(run.age_s)} s.` : "";
  head.append(el("h3", "rm-run", run.name), status);
  node.append(head);
  node.dataset.status = run.status;
  const errors = [...run.errors, ...(result?.error ? [result.error] : [])];
  if (errors.length) {
    const box = el("div", "rm-error");
    box.append(el("strong", "", "This run's data cannot be read."), ...errors.map((e) => el("p", "", e)));
    node.append(box);
  }
  if (run.notes?.length) { // overlapping event files: read, but worth knowing
    const box = el("div", "rm-note");
    box.append(el("strong", "", "Note on this run's files."), ...run.notes.map((n) => el("p", "", n)));
    node.append(box);
  }
  if (!result?.summary) {
    if (!errors.length) node.append(el("p", "rm-muted", "Loading…"));
    return node;
  }
  const s = result.summary;
  const facts = el("p", "rm-facts");
  const steps = el("span", "rm-steps", s.steps.toLocaleString());
  steps.dataset.steps = String(s.steps);
  facts.append(steps, el("span", "", ` steps · ${fixed(s.wall_s, 1)} s of training · ${s.backend || "?"} backend`));
  node.append(facts);
  node.append(el("div", `rm-verdict rm-verdict-${s.verdict}`, s.verdict_text));
  const gpuIdle = s.gpus.map((gpu) => gpu.idle_fraction).filter((v) => v !== null);
  const noUtil = s.gpus.length ? `utilization ${s.gpus[0].utilization}` : "none seen by NVML";
  node.append(tiles([
    ["GPU idle", gpuIdle.length ? pct(gpuIdle.reduce((a, b) => a + b, 0) / gpuIdle.length) : (s.gpus.length ? "n/a" : "no GPU"),
      gpuIdle.length ? "of utilization samples" : noUtil],
    // The shares the verdict and the findings (INPUT_BOUND, HOST_BOUND) state: of step time (step + host gap),
    // input wait beyond what fetching a ready batch costs.
    ["Input wait", s.shares.input === null ? "n/a" : pct(s.shares.input),
      s.shares.input === null ? s.input_wait_measured : "of step time"],
    ["Host gaps", s.shares.host === null ? "n/a" : pct(s.shares.host), "of step time"],
    ["Median step", s.step_ms.median === null ? "n/a" : `${fixed(s.step_ms.median, 2)} ms`,
      s.step_ms.p90 === null ? "" : `p90 ${fixed(s.step_ms.p90, 2)} ms`],
  ]));
  if (s.profile) node.append(profileLine(s.profile));
  node.append(findings(s, run.live));
  return node;
}

// The profile captured on an alert: where it went and, where the Profile tab cannot group this model's steps, why.
function profileLine(profile) {
  const box = el("div", profile.note ? "rm-note rm-profile" : "rm-muted rm-profile");
  const head = profile.status === "captured"
    ? `Profile: ${profile.steps} steps after ${profile.rule}, in ${profile.dir}.`
    : `Profile after ${profile.rule}: ${profile.status}.`;
  box.append(el("strong", "", head));
  if (profile.note) box.append(el("p", "", profile.note));
  return box;
}

function tiles(items) {
  const grid = el("div", "rm-tiles");
  for (const [label, value, note] of items) {
    const tile = el("div", "rm-tile");
    tile.append(el("div", "rm-tile-label", label), el("div", "rm-tile-value", value), el("div", "rm-tile-note", note));
    grid.append(tile);
  }
  return grid;
}

// The run's three most severe findings (the first open on its fix), or the verdict's advice without any, and a
// line on its alerts.
function findings(summary, live) {
  const list = el("div", "rm-findings");
  summary.findings.slice(0, 3).forEach((f, i) => {
    const item = el("details", `rm-finding rm-sev-${f.severity}`);
    item.open = i === 0; // the most severe one shows its fix; the others open on click
    item.dataset.code = f.code;
    const head = el("summary", "");
    const code = el("code", "rm-finding-code", f.code);
    code.title = "Look this code up in rnnmon's docs or `rnnmon report`";
    head.append(el("span", "rm-sev", f.severity), el("span", "rm-finding-text", f.message), code);
    item.append(head, el("div", "rm-advice", `Fix: ${f.advice}`), el("div", "rm-where", `Where: ${f.where}`));
    list.append(item);
  });
  if (summary.findings.length > 3) {
    list.append(el("div", "rm-more", `${summary.findings.length - 3} more in \`rnnmon report\``));
  }
  if (!summary.findings.length && summary.verdict_advice) {
    const item = el("div", "rm-finding rm-sev-info");
    item.append(el("span", "rm-sev", "advice"), el("span", "rm-finding-text", summary.verdict_advice));
    list.append(item);
  }
  if (summary.alerts.length) { // the alerts themselves are in the list below the chart
    const open = summary.alerts.filter((alert) => alert.end === null);
    const firing = live ? open : [];
    const rules = [...new Set((firing.length ? firing : summary.alerts).map((alert) => alert.rule))];
    const item = el("div", `rm-finding rm-sev-${firing.length ? "critical" : "warning"}`);
    const count = `${summary.alerts.length} alert${summary.alerts.length === 1 ? "" : "s"}`;
    const still = firing.length ? `, ${firing.length} still firing` : open.length ? `, ${open.length} unresolved` : "";
    item.append(el("span", "rm-sev", firing.length ? "firing" : "alerts"),
      el("span", "rm-finding-text", `${count}${still}: ${rules.join(", ")} (listed below the chart)`));
    list.append(item);
  }
  return list;
}

// Every alert of `runs` that has a summary in `results`, newest first, at most ALERT_LIMIT per run.
export function drawAlerts(section, runs, results) {
  const shown = runs.filter((run) => results.get(run.run)?.summary);
  section.hidden = !shown.length;
  if (!shown.length) return;
  const rows = [];
  let more = 0;
  for (const run of shown) {
    const result = results.get(run.run);
    const alerts = result.summary.alerts;
    more += Math.max(0, alerts.length - ALERT_LIMIT);
    for (const alert of alerts.slice(-ALERT_LIMIT)) rows.push(alertRow(run, alert, result.timeline?.origin));
  }
  rows.sort((a, b) => Number(b.dataset.start) - Number(a.dataset.start)); // newest first
  const head = el("div", "rm-alerts-head");
  const firing = rows.filter((row) => row.dataset.firing === "1").length;
  head.append(el("h2", "", "Alerts"), el("span", "rm-muted", rows.length
    ? `${rows.length} in ${shown.length === 1 ? "this run" : "the runs shown"}${firing ? `, ${firing} firing` : ""}`
    : ""));
  if (!rows.length) {
    section.replaceChildren(head, el("p", "rm-muted rm-alerts-none",
      "No alerts in the runs shown. Alerts fire when a rule's thresholds are crossed; set them under " +
      "Alert thresholds."));
    return;
  }
  const table = el("table", "rm-alert-table");
  const top = el("tr");
  for (const title of ["Run", "Rule", "Device", "Start", "End", "Value", "Threshold", "Message"]) {
    top.append(el("th", "", title));
  }
  const thead = el("thead");
  thead.append(top);
  const tbody = el("tbody");
  tbody.append(...rows);
  table.append(thead, tbody);
  const parts = [head, table];
  if (more) parts.push(el("p", "rm-muted", `${more} older alerts are not shown; \`rnnmon report\` lists them all.`));
  section.replaceChildren(...parts);
}

function alertRow(run, alert, origin) {
  const spec = ruleSpec(alert.rule);
  const firing = alert.end === null && run.live; // open in a run that stopped writing: unresolved, not firing
  const row = el("tr", firing ? "rm-alert-firing" : "");
  row.dataset.rule = String(alert.rule);
  row.dataset.run = run.run;
  row.dataset.threshold = String(alert.threshold);
  row.dataset.start = String(alert.start);
  row.dataset.firing = firing ? "1" : "0";
  const rule = el("td", "rm-alert-rule");
  rule.append(el("code", "", String(alert.rule)));
  rule.title = spec.label;
  const end = el("td");
  if (firing) end.append(el("span", "rm-badge-firing", "firing"));
  else if (alert.end === null) {
    const badge = el("span", "rm-badge-open", "unresolved");
    badge.title = "The run stopped writing while this alert was firing";
    end.append(badge);
  }
  else end.append(...when(alert.end, origin));
  const start = el("td");
  start.append(...when(alert.start, origin));
  row.append(el("td", "rm-alert-run", run.name), rule,
    el("td", "", alert.device === null || alert.device === undefined ? "run" : `GPU ${alert.device}`), start, end,
    el("td", "rm-num", `${short(alert.value)}${spec.unit}`),
    el("td", "rm-num", `${short(alert.threshold)}${spec.unit}`),
    el("td", "rm-alert-message", String(alert.message || "")));
  return row;
}

// A Unix time as the clock time, and as the chart's seconds since the run's start when that is known.
function when(unix, origin) {
  const clock = new Date(1e3 * unix).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", second: "2-digit"});
  const parts = [el("span", "", clock)];
  if (origin !== undefined) parts.push(el("span", "rm-muted", ` · ${fixed(unix - origin, 1)} s`));
  return parts;
}
