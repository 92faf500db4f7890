// rnnmon's TensorBoard tab: why is the GPU idle, step by step?
//
// A plain ES module that TensorBoard loads in an iframe and calls `render()` on. It reads the plugin's routes
// (`runs`, `timeline`, `summary`, `thresholds`; see http_api.md), draws one plotly figure whose subplots share a
// time axis (a column per compared run) with the runs' alerts as red bands, lists the alerts, and polls while a
// run is live. The alert thresholds panel lives in thresholds.js. Data from runs (names, device names, findings,
// alert messages) reaches the DOM only through textContent, and plotly only through `plotlyText`, which escapes
// markup.
//
// Example (what TensorBoard's iframe does):
//   import("./index.js").then((m) => m.render());

import {ROUTE, el, errorText, fixed, pct, plotlyText, short} from "./dom.js";
import {RULES, buildThresholdsPanel, currentThresholds, loadThresholds, noteRuns, onThresholdsChange} from
  "./thresholds.js";

const POLL_MS = 1000; // /runs is cheap; with TensorBoard's reload and rnnmon's flush, a step shows within ~5 s
const PLOT_HEIGHT = 600;
const BAR_LIMIT = 600; // more steps than this in view: lines instead of stacked bars
const ALERT_LIMIT = 200; // alerts drawn and listed per run; `rnnmon report` has them all
const ALERT = {band: "rgba(220, 38, 38, 0.09)", color: "#dc2626", laneY: 108}; // laneY: above 100%

const CAUSES = {
  input: {label: "input pipeline", color: "rgba(245, 158, 11, 0.45)"},
  host: {label: "host / Python", color: "rgba(139, 92, 246, 0.45)"},
  eval: {label: "validation", color: "rgba(20, 184, 166, 0.45)"},
  other: {label: "unexplained", color: "rgba(100, 116, 139, 0.45)"},
  sync: {label: "waiting for another GPU", color: "rgba(225, 29, 72, 0.45)"},
};
const PHASES = {
  eval: {label: "validation phase", color: "rgba(20, 184, 166, 0.10)"},
  epoch_end: {label: "epoch end", color: "rgba(99, 102, 241, 0.12)"},
  warmup: {label: "warm-up (tracing)", color: "rgba(148, 163, 184, 0.22)"},
};
const COLORS = {compute: "#2563eb", wait: "#f59e0b", host: "#8b5cf6", gpu: ["#0f766e", "#1d4ed8", "#be123c", "#7c3aed"]};
const GPU_DOMAIN = [0.62, 1.0]; // shared by one utilization row per GPU
const STEP_ROWS = [
  {title: "Step time (ms)", domain: [0.27, 0.56]},
  {title: "Host gap (ms)", domain: [0.0, 0.21]},
];
let ROWS = chartRows([]); // the GPU rows of the runs shown, then STEP_ROWS; set by drawChart
const STATUS_TEXT = {live: "live", stalled: "no new data", finished: "finished", failed: "failed",
  interrupted: "interrupted", terminated: "terminated", aborted: "aborted", unknown: "unknown"};
const VERDICT_ADVICE = {
  "input-bound": "Overlap input with compute: map(..., num_parallel_calls=tf.data.AUTOTUNE) and " +
    ".prefetch(tf.data.AUTOTUNE); cache decoded data when it fits.",
  "host-bound": "Cut Python work between steps: fewer per-batch callbacks and logging, or raise " +
    "steps_per_execution.",
  "compute-bound": "The steps keep the device busy; further speed comes from the model itself " +
    "(cuDNN-eligible RNN layers, mixed precision, larger batches).",
};

const state = {runs: [], selected: ["", ""], view: null, results: new Map(), written: new Map(), statuses: "",
  workers: null};
const WORKER_RUN = /(^|\/)(worker|chief|evaluator|process)-\d+\/rnnmon$/; // a worker of a multi-worker job
const ui = {};

export async function render() {
  buildSkeleton();
  onThresholdsChange(() => drawChart()); // the gpu_util_low line follows the saved thresholds
  try {
    await loadPlotly();
  } catch (error) {
    showMessage("error", "The chart library could not be loaded", [String(error.message || error)]);
  }
  const loop = async () => {
    await Promise.all([poll(), loadThresholds()]);
    setTimeout(loop, POLL_MS); // after each answer, so slow answers never pile up
  };
  await loop();
}

// --- data --------------------------------------------------------------------------------------------------
async function getJson(name, params = {}) {
  const url = ROUTE(name);
  for (const [key, value] of Object.entries(params)) url.searchParams.set(key, value);
  const response = await fetch(url);
  if (!response.ok) throw new Error(errorText(await response.text()) || `${response.status} ${response.statusText}`);
  return response.json();
}

async function poll() {
  let listing;
  try {
    listing = await getJson("runs");
  } catch (error) {
    showMessage("error", "Cannot read the run list from TensorBoard", [String(error.message || error)]);
    return;
  }
  state.runs = listing.runs;
  noteRuns(state.runs);
  ui.controls.hidden = !state.runs.length;
  updateSelectors();
  if (!state.runs.length) {
    showEmptyState();
    return;
  }
  hideMessage();
  const stale = selectedRuns().filter((run) => state.written.get(run.run) !== run.last_write);
  const statuses = selectedRuns().map((run) => `${run.run}:${run.status}`).join("|");
  if (stale.length) await refresh(stale.map((run) => run.run));
  else if (statuses !== state.statuses) drawCards();
  state.statuses = statuses;
}

async function refresh(names) {
  const width = document.documentElement.clientWidth; // the plot may be hidden (0 wide) before the first data
  const points = Math.max(200, Math.round(width / Math.max(1, selectedRuns().length)));
  const view = state.view;
  const range = view ? {start: view[0].toFixed(4), end: view[1].toFixed(4)} : {};
  await Promise.all(names.map(async (name) => {
    const written = state.runs.find((run) => run.run === name)?.last_write;
    let result;
    try {
      const [timeline, summary] = await Promise.all([
        getJson("timeline", {run: name, points, ...range}), getJson("summary", {run: name})]);
      result = {timeline, summary};
    } catch (error) {
      result = {error: String(error.message || error)};
    }
    if (state.view !== view) return; // zoomed meanwhile: the refresh for the new view wins
    state.results.set(name, result);
    state.written.set(name, written);
  }));
  const first = state.selected[0];
  state.workers = WORKER_RUN.test(first) ? await getJson("workers", {run: first}).catch(() => null) : null;
  drawCards();
  drawChart();
}

function selectedRuns() {
  return state.selected.map((name) => state.runs.find((run) => run.run === name)).filter(Boolean);
}

// --- page structure ----------------------------------------------------------------------------------------
function buildSkeleton() {
  const style = el("link");
  style.rel = "stylesheet";
  style.href = ROUTE("style.css");
  document.head.append(style);
  const app = el("div", "rm-app");
  const header = el("header", "rm-header");
  const title = el("div", "rm-title");
  title.append(el("span", "rm-name", "RNN Monitor"), el("span", "rm-sub", "why is the GPU idle, step by step"));
  ui.runA = el("select", "rm-select");
  ui.runA.id = "rm-run-a";
  ui.runB = el("select", "rm-select");
  ui.runB.id = "rm-run-b";
  const labelA = el("label", "rm-control", "Run ");
  labelA.append(ui.runA);
  const labelB = el("label", "rm-control", "Compare with ");
  labelB.append(ui.runB);
  ui.reset = el("button", "rm-button", "Reset zoom");
  ui.reset.addEventListener("click", () => setView(null));
  ui.controls = el("div", "rm-controls");
  ui.controls.append(labelA, labelB, ui.reset);
  const thresholds = buildThresholdsPanel(); // also before any run exists: thresholds can be set up front
  const actions = el("div", "rm-actions");
  actions.append(ui.controls, thresholds.toggle);
  header.append(title, actions);
  ui.message = el("section", "rm-message");
  ui.message.hidden = true;
  ui.cards = el("section", "rm-cards");
  ui.workers = el("section", "rm-alerts rm-workers");
  ui.workers.id = "rm-workers";
  ui.workers.hidden = true;
  ui.plot = el("div", "rm-plot");
  ui.plot.id = "rm-plot";
  ui.alerts = el("section", "rm-alerts");
  ui.alerts.id = "rm-alerts";
  ui.alerts.hidden = true;
  app.append(header, thresholds.section, ui.message, ui.cards, ui.workers, ui.plot, ui.alerts);
  document.body.append(app);
  for (const [index, select] of [ui.runA, ui.runB].entries()) {
    select.addEventListener("change", () => {
      state.selected[index] = select.value;
      if (index === 0 && state.selected[1] === select.value) state.selected[1] = "";
      updateSelectors();
      refresh(selectedRuns().map((run) => run.run));
    });
  }
}

function updateSelectors() {
  const names = state.runs.map((run) => run.run);
  if (!names.includes(state.selected[0])) state.selected[0] = names[0] || "";
  if (!names.includes(state.selected[1]) || state.selected[1] === state.selected[0]) {
    state.selected[1] = state.selected[1] === "" && names.length === 2 && state.results.size === 0
      ? names.find((name) => name !== state.selected[0]) : "";
  }
  fillSelect(ui.runA, state.runs, state.selected[0], null);
  fillSelect(ui.runB, state.runs.filter((run) => run.run !== state.selected[0]), state.selected[1], "none");
}

function fillSelect(select, runs, value, emptyLabel) {
  const signature = JSON.stringify([value, emptyLabel, runs.map((run) => [run.run, run.live])]);
  if (select.dataset.signature === signature) return; // rebuilding would close an open dropdown
  select.dataset.signature = signature;
  const options = [];
  if (emptyLabel) options.push(option("", emptyLabel));
  for (const run of runs) options.push(option(run.run, `${run.name}${run.live ? "  (live)" : ""}`));
  select.replaceChildren(...options);
  select.value = value;
}

function option(value, text) {
  const node = el("option", "", text);
  node.value = value;
  return node;
}

function showMessage(kind, heading, lines, code) {
  ui.message.hidden = false;
  ui.message.className = `rm-message rm-${kind}`;
  const children = [el("h2", "", heading), ...lines.map((line) => el("p", "", line))];
  if (code) children.push(el("pre", "rm-code", code));
  ui.message.replaceChildren(...children);
}

function hideMessage() {
  ui.message.hidden = true;
}

function showEmptyState() {
  ui.cards.replaceChildren();
  ui.alerts.hidden = true;
  if (window.Plotly) window.Plotly.purge(ui.plot);
  ui.plot.hidden = true;
  showMessage("empty", "No rnnmon data in this log directory yet", [
    "Add the callback to model.fit, then point TensorBoard at the parent of the run directories. " +
    "This page checks for new data every few seconds.",
  ], "import rnnmon\n\nmodel.fit(dataset, epochs=3,\n          callbacks=[rnnmon.UtilizationMonitor(\"runs/exp1\")])\n\n" +
    "# then:  tensorboard --logdir runs");
}

// --- summary cards -----------------------------------------------------------------------------------------
function drawCards() {
  const runs = selectedRuns();
  ui.cards.style.gridTemplateColumns = `repeat(${Math.max(1, runs.length)}, minmax(0, 1fr))`;
  ui.cards.replaceChildren(...runs.map((run) => card(run, state.results.get(run.run))));
  drawWorkers();
  drawAlerts();
}

// The workers of the first run's multi-worker job side by side, with the straggler (see /workers).
function drawWorkers() {
  const ms = (value) => (value === null || value === undefined ? "n/a" : `${fixed(value, 2)} ms`);
  const group = state.workers;
  ui.workers.hidden = !group?.workers?.length;
  if (ui.workers.hidden) return;
  const table = el("table", "rm-alert-table rm-workers-table");
  const top = el("tr");
  for (const title of ["Worker", "Median step", "Input wait", "Host gap", "GPU idle"]) top.append(el("th", "", title));
  const thead = el("thead");
  thead.append(top);
  const tbody = el("tbody");
  const straggler = group.findings[0];
  for (const row of group.workers) {
    const tr = el("tr", straggler?.where === row.worker ? "rm-alert-firing" : "");
    tr.dataset.worker = row.worker;
    tr.append(el("td", "", row.worker), el("td", "", ms(row.step_ms)), el("td", "", ms(row.input_wait_ms)),
      el("td", "", pct(row.host_gap_fraction)), el("td", "", pct(row.gpu_idle_fraction)));
    tbody.append(tr);
  }
  table.append(thead, tbody);
  const head = el("div", "rm-alerts-head");
  head.append(el("h2", "", "Workers"), el("span", "rm-muted", `job ${group.job}, ${group.workers.length} workers`));
  const parts = [head, table];
  if (straggler) parts.push(el("p", "rm-straggler", `${straggler.code} at ${straggler.where}: ${straggler.message}`));
  ui.workers.replaceChildren(...parts);
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
    ["Input wait", s.input_wait_fraction === null ? "n/a" : pct(s.input_wait_fraction),
      s.input_wait_fraction === null ? s.input_wait_measured : "of training time"],
    ["Host gaps", pct(s.host_gap_fraction), "of training time"],
    ["Median step", s.step_ms.median === null ? "n/a" : `${fixed(s.step_ms.median, 2)} ms`,
      s.step_ms.p90 === null ? "" : `p90 ${fixed(s.step_ms.p90, 2)} ms`],
  ]));
  node.append(findings(s, run.live));
  return node;
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
  if (!summary.findings.length && VERDICT_ADVICE[summary.verdict]) {
    const item = el("div", "rm-finding rm-sev-info");
    item.append(el("span", "rm-sev", "advice"), el("span", "rm-finding-text", VERDICT_ADVICE[summary.verdict]));
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

// --- alert list --------------------------------------------------------------------------------------------
function drawAlerts() {
  const runs = selectedRuns().filter((run) => state.results.get(run.run)?.summary);
  ui.alerts.hidden = !runs.length;
  if (!runs.length) return;
  const rows = [];
  let more = 0;
  for (const run of runs) {
    const result = state.results.get(run.run);
    const alerts = result.summary.alerts;
    more += Math.max(0, alerts.length - ALERT_LIMIT);
    for (const alert of alerts.slice(-ALERT_LIMIT)) rows.push(alertRow(run, alert, result.timeline?.origin));
  }
  rows.sort((a, b) => Number(b.dataset.start) - Number(a.dataset.start)); // newest first
  const head = el("div", "rm-alerts-head");
  const firing = rows.filter((row) => row.dataset.firing === "1").length;
  head.append(el("h2", "", "Alerts"), el("span", "rm-muted", rows.length
    ? `${rows.length} in ${runs.length === 1 ? "this run" : "the runs shown"}${firing ? `, ${firing} firing` : ""}`
    : ""));
  if (!rows.length) {
    ui.alerts.replaceChildren(head, el("p", "rm-muted rm-alerts-none",
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
  ui.alerts.replaceChildren(...parts);
}

function alertRow(run, alert, origin) {
  const spec = RULES[alert.rule] || {label: alert.rule, unit: ""};
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

// --- chart -------------------------------------------------------------------------------------------------
function drawChart() {
  if (!window.Plotly) return;
  const columns = selectedRuns().map((run) => state.results.get(run.run)).filter((r) => r?.timeline);
  ui.plot.hidden = !columns.length;
  if (!columns.length) {
    window.Plotly.purge(ui.plot);
    return;
  }
  ROWS = chartRows(columns);
  const figure = {data: [], layout: baseLayout(columns)};
  const legend = new Set();
  columns.forEach((result, c) => addColumn(figure, result, c, columns.length, legend));
  const first = window.Plotly.react(ui.plot, figure.data, figure.layout,
    {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"]});
  if (!ui.plot.dataset.bound) {
    ui.plot.dataset.bound = "1";
    first.then(() => ui.plot.on("plotly_relayout", onRelayout));
  }
  ui.plot.dataset.view = state.view ? state.view.map((v) => v.toFixed(3)).join(",") : "all";
  ui.plot.dataset.newest = String(Math.max(...columns.map((r) => r.timeline.origin + r.timeline.extent.end)));
}

function axisId(prefix, n) {
  return n === 1 ? prefix : `${prefix}${n}`;
}

// One utilization row per GPU (as many as the run with the most GPUs), on the shared time axis.
function chartRows(columns) {
  const count = Math.max(1, ...columns.map((result) => result.timeline.gpus.length));
  const [lo, hi] = GPU_DOMAIN;
  const gap = 0.02;
  const height = (hi - lo - gap * (count - 1)) / count;
  const first = columns[0]?.timeline.gpus || [];
  const gpuRows = Array.from({length: count}, (_, g) => ({
    title: count === 1 ? "GPU util (%) · idle gaps" : `GPU ${first[g]?.index ?? g} util (%)`,
    domain: [hi - (g + 1) * height - g * gap, hi - g * height - g * gap], gpu: true}));
  return [...gpuRows, ...STEP_ROWS];
}

function baseLayout(columns) {
  const count = columns.length;
  const lane = columns.some((result) => result.summary?.alerts?.length); // room above 100% for the alert lane
  const gap = 0.05;
  const width = (1 - gap * (count - 1)) / count;
  const layout = {
    height: PLOT_HEIGHT, margin: {l: 64, r: 16, t: 64, b: 48}, barmode: "stack", bargap: 0,
    hovermode: "closest", dragmode: "zoom", uirevision: "rnnmon", showlegend: true,
    legend: {orientation: "h", x: 0, y: 1.1, yanchor: "bottom", font: {size: 11}},
    font: {family: "Roboto, system-ui, sans-serif", size: 12, color: "#334155"},
    paper_bgcolor: "#ffffff", plot_bgcolor: "#ffffff", shapes: [], annotations: [],
  };
  columns.forEach((result, c) => {
    const x0 = c * (width + gap);
    layout.annotations.push({text: plotlyText(displayName(result.timeline.run)), xref: "paper", yref: "paper",
      x: x0 + width / 2, y: 1.0, yanchor: "bottom", showarrow: false, font: {size: 13, color: "#0f172a"}});
    ROWS.forEach((row, r) => {
      const n = r * count + c + 1;
      const xaxis = {domain: [x0, x0 + width], anchor: axisId("y", n), showgrid: true, gridcolor: "#eef2f7",
        zeroline: false, showticklabels: r === ROWS.length - 1, ticksuffix: " s", showline: true,
        linecolor: "#cbd5e1"};
      if (n > 1) xaxis.matches = "x";
      if (r === ROWS.length - 1) xaxis.title = {text: "time since run start (s)", standoff: 6};
      if (state.view) xaxis.range = [...state.view];
      else xaxis.autorange = true;
      const yaxis = {domain: row.domain, anchor: axisId("x", n), fixedrange: true, gridcolor: "#eef2f7",
        zeroline: false, showline: true, linecolor: "#cbd5e1", rangemode: "tozero"};
      if (c === 0) yaxis.title = {text: row.title, font: {size: 11}};
      if (c > 0) yaxis.matches = axisId("y", r * count + 1);
      if (row.gpu) {
        const top = r === 0 && lane ? 114 : 105;
        Object.assign(yaxis, {range: [0, top], tickvals: ROWS[1]?.gpu ? [0, 50, 100] : [0, 20, 40, 60, 80, 100]});
      }
      else yaxis.autorange = true;
      layout[axisId("xaxis", n)] = xaxis;
      layout[axisId("yaxis", n)] = yaxis;
    });
  });
  return layout;
}

function addColumn(figure, result, c, count, legend) {
  const timeline = result.timeline;
  const n = (r) => r * count + c + 1;
  const ref = (prefix, r) => (n(r) === 1 ? prefix : `${prefix}${n(r)}`);
  const axes = (r) => ({xaxis: ref("x", r), yaxis: ref("y", r)});
  const once = (key) => (legend.has(key) ? false : (legend.add(key), true));
  const span = state.view ? state.view[1] - state.view[0] : Math.max(timeline.extent.end, 1e-3);
  const minWidth = span / Math.max(300, ui.plot.clientWidth / count) * 1.5; // keep short gaps visible

  // GPU rows: each GPU's idle gaps as bands (a binned band's height is the share of its bucket that was idle),
  // then its utilization line. Gaps from step phases (no GPU) go on the first row.
  const gaps = timeline.gaps;
  const gpuCount = ROWS.filter((row) => row.gpu).length;
  const gpuRow = new Map(timeline.gpus.map((gpu, i) => [gpu.index, Math.min(i, gpuCount - 1)]));
  const rowOf = (device) => (device === null ? 0 : gpuRow.get(device) ?? 0);
  for (const [cause, style] of Object.entries(CAUSES)) for (let r = 0; r < gpuCount; r++) {
    const xs = [];
    const ys = [];
    const mx = [];
    const my = [];
    const text = [];
    gaps.cause.forEach((kind, i) => {
      if (kind !== cause || rowOf(gaps.device[i]) !== r) return;
      const start = gaps.start[i];
      const end = Math.max(gaps.end[i], start + minWidth);
      const top = 100 * gaps.share[i];
      const where = gaps.device[i] === null ? "" : ` (GPU ${gaps.device[i]})`;
      xs.push(start, start, end, end, null);
      ys.push(0, top, top, 0, null);
      mx.push((start + end) / 2);
      my.push(top / 2);
      text.push(gaps.binned
        ? `${style.label}${where}: ${pct(gaps.share[i])} idle<br>${fixed(start, 2)}–${fixed(gaps.end[i], 2)} s`
        : `idle${where}: ${style.label}<br>${fixed(1e3 * (gaps.end[i] - start), 1)} ms at ${fixed(start, 3)} s`);
    });
    if (!xs.length) continue;
    figure.data.push({type: "scatter", mode: "lines", x: xs, y: ys, fill: "toself", fillcolor: style.color,
      line: {width: 0}, hoverinfo: "skip", name: `idle: ${style.label}`, legendgroup: `gap-${cause}`,
      showlegend: once(`gap-${cause}`), ...axes(r)});
    figure.data.push({type: "scatter", mode: "markers", x: mx, y: my, marker: {opacity: 0, size: 10},
      text, hovertemplate: "%{text}<extra></extra>", showlegend: false, legendgroup: `gap-${cause}`, ...axes(r)});
  }
  timeline.gpus.forEach((gpu, i) => {
    const color = COLORS.gpu[i % COLORS.gpu.length];
    const label = `GPU ${gpu.index}`;
    figure.data.push({type: "scatter", mode: "lines", x: gpu.util.time, y: gpu.util.value, name: `${label} utilization`,
      line: {color, width: 1.5}, legendgroup: `gpu-${gpu.index}`, showlegend: once(`gpu-${gpu.index}`),
      hovertemplate: `${plotlyText(gpu.name)}<br>%{y:.0f}% at %{x:.2f} s<extra>${label}</extra>`,
      ...axes(rowOf(gpu.index))});
    if (gpu.sm_activity) {
      figure.data.push({type: "scatter", mode: "lines", x: gpu.sm_activity.time, y: gpu.sm_activity.value,
        name: `${label} SM activity`, line: {color, width: 1, dash: "dot"}, legendgroup: `sm-${gpu.index}`,
        showlegend: once(`sm-${gpu.index}`), hovertemplate: `SM activity %{y:.0f}% at %{x:.2f} s<extra>${label}</extra>`,
        ...axes(rowOf(gpu.index))});
    }
  });
  const unmeasured = timeline.gpus.filter((gpu) => gpu.utilization !== "nvml" && gpu.utilization !== "gpm");
  if (!timeline.gpus.length || unmeasured.length) {
    const text = timeline.gpus.length
      ? `GPU ${unmeasured[0].index}: utilization ${unmeasured[0].utilization}: bands are non-compute gaps from step timing`
      : "No GPU seen by NVML: bands are non-compute gaps from step timing";
    figure.layout.annotations.push({text,
      xref: `${ref("x", 0)} domain`, yref: `${ref("y", 0)} domain`, x: 0.5, y: 0.95, showarrow: false,
      font: {size: 11, color: "#64748b"}, bgcolor: "rgba(255,255,255,0.8)"});
  }

  // The step rows: per-step input wait + compute, and host gaps.
  const stepRow = gpuCount;
  const steps = timeline.steps;
  const bars = !steps.downsampled && steps.time.length <= BAR_LIMIT;
  const hover = (what) => `step %{customdata}<br>${what} %{y:.2f} ms at %{x:.2f} s<extra></extra>`;
  const series = (name, y, color, r, key) => {
    const trace = {name, y, customdata: steps.step, hovertemplate: hover(name), legendgroup: key,
      showlegend: once(key), ...axes(r)};
    if (bars) {
      const width = steps.duration_ms.map((ms) => ms / 1e3);
      return {...trace, type: "bar", x: steps.time.map((t, i) => t + width[i] / 2), width,
        marker: {color, line: {width: 0}}};
    }
    return {...trace, type: "scatter", mode: "lines", x: steps.time, line: {color, width: 1}};
  };
  if (steps.input_wait_ms.some((v) => v !== null)) {
    figure.data.push(series("input wait", steps.input_wait_ms, COLORS.wait, stepRow, "wait"));
  }
  figure.data.push(series("compute", steps.compute_ms, COLORS.compute, stepRow, "compute"));
  const hostBars = series("host gap", steps.host_gap_ms, COLORS.host, stepRow + 1, "host");
  if (bars) hostBars.x = steps.time; // the gap ends where the step begins
  figure.data.push(hostBars);
  if (!steps.total) {
    figure.layout.annotations.push({text: "no training steps in this range", xref: `${ref("x", stepRow)} domain`,
      yref: `${ref("y", stepRow)} domain`, x: 0.5, y: 0.5, showarrow: false, font: {color: "#94a3b8"}});
  }

  // Phases (validation, epoch ends, warm-up) shade the whole column; a binned one fades with its share.
  const phases = timeline.phases;
  phases.kind.forEach((kind, i) => {
    const style = PHASES[kind];
    if (!style) return;
    figure.layout.shapes.push({type: "rect", layer: "below", xref: ref("x", 0), yref: "paper",
      x0: phases.start[i], x1: Math.max(phases.end[i], phases.start[i] + minWidth),
      y0: ROWS[ROWS.length - 1].domain[0], y1: ROWS[0].domain[1], fillcolor: style.color,
      opacity: Math.max(0.3, phases.share[i]), line: {width: 0}, name: style.label,
      legendgroup: `phase-${kind}`, showlegend: once(`phase-${kind}`)});
  });

  // The gpu_util_low threshold now saved (or the default) on each utilization row.
  const low = currentThresholds()?.gpu_util_low;
  if (low?.enabled) {
    new Set(timeline.gpus.map((gpu) => rowOf(gpu.index))).forEach((r) => {
      figure.layout.shapes.push({type: "line", layer: "above", xref: `${ref("x", r)} domain`, yref: ref("y", r),
        x0: 0, x1: 1, y0: low.pct, y1: low.pct, line: {color: ALERT.color, width: 1.2, dash: "dash"},
        label: {text: `gpu_util_low < ${short(low.pct)}%`, textposition: "end", yanchor: "bottom",
          font: {size: 10, color: ALERT.color}},
        name: "gpu_util_low threshold", legendgroup: "threshold", showlegend: once("threshold")});
    });
  }
  addAlerts(figure, result, ref("x", 0), ref("y", 0), minWidth, once);
}

// Alerts as red bands across the column's rows, and a lane above 100% on the first row that carries the hover.
function addAlerts(figure, result, xaxis, yaxis, minWidth, once) {
  const timeline = result.timeline;
  const alerts = (result.summary?.alerts || []).slice(-ALERT_LIMIT);
  if (!alerts.length) return;
  const live = state.runs.find((run) => run.run === timeline.run)?.live;
  const xs = [];
  const ys = [];
  const text = [];
  for (const alert of alerts) {
    const start = alert.start - timeline.origin; // Unix seconds to the chart's seconds since the run's start
    const end = Math.max(alert.end === null ? timeline.extent.end : alert.end - timeline.origin, start + minWidth);
    figure.layout.shapes.push({type: "rect", layer: "below", xref: xaxis, yref: "paper", x0: start, x1: end,
      y0: ROWS[ROWS.length - 1].domain[0], y1: ROWS[0].domain[1], fillcolor: ALERT.band, line: {width: 0}});
    const spec = RULES[alert.rule] || {unit: ""};
    const device = alert.device === null || alert.device === undefined ? "" : ` · GPU ${alert.device}`;
    const open = alert.end === null ? (live ? "now (firing)" : "end of data (unresolved)") : "";
    const span = `${fixed(start, 1)} s – ${open || `${fixed(end, 1)} s`}`;
    const first = String(alert.message || "").split(". ")[0].slice(0, 140);
    const label = `<b>${plotlyText(alert.rule)}</b>${device}<br>${short(alert.value)}${spec.unit} ` +
      `(threshold ${short(alert.threshold)}${spec.unit}) · ${span}<br>${plotlyText(first)}`;
    xs.push(start, (start + end) / 2, end, null);
    ys.push(ALERT.laneY, ALERT.laneY, ALERT.laneY, null);
    text.push(label, label, label, null);
  }
  figure.data.push({type: "scatter", mode: "lines+markers", x: xs, y: ys, text, name: "alert",
    line: {color: ALERT.color, width: 6}, marker: {size: 10, opacity: 0, color: ALERT.color},
    hovertemplate: "%{text}<extra></extra>", legendgroup: "alert", showlegend: once("alert"), connectgaps: false,
    xaxis, yaxis});
}

function onRelayout(event) {
  const keys = Object.keys(event);
  if (keys.some((key) => /^xaxis\d*\.autorange$/.test(key))) {
    setView(null);
    return;
  }
  const lo = keys.find((key) => /^xaxis\d*\.range\[0\]$/.test(key));
  const hi = keys.find((key) => /^xaxis\d*\.range\[1\]$/.test(key));
  const whole = keys.find((key) => /^xaxis\d*\.range$/.test(key));
  if (lo && hi) setView([Number(event[lo]), Number(event[hi])]);
  else if (whole) setView(event[whole].map(Number));
}

function setView(view) {
  state.view = view && view[1] > view[0] ? [Math.max(0, view[0]), view[1]] : null;
  clearTimeout(ui.viewTimer);
  ui.viewTimer = setTimeout(() => refresh(selectedRuns().map((run) => run.run)), 150);
}

function displayName(run) {
  return state.runs.find((r) => r.run === run)?.name || run;
}

function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = ROUTE("plotly.min.js");
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => reject(new Error("plotly.min.js did not load; is the plotly package installed?"));
    document.head.append(script);
  });
}
