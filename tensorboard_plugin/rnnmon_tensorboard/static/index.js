// rnnmon's TensorBoard tab: why is the GPU idle, step by step?
//
// A plain ES module that TensorBoard loads in an iframe and calls `render()` on. It builds the page, holds the
// tab's state (the runs listed, the two selected, the zoomed view, each run's data) and wires the parts together:
// polling.js reads the plugin's routes (see http_api.md) while a run is live, chart.js draws one plotly figure
// whose subplots share a time axis (a column per compared run), cards.js the run cards and the alert list,
// workers.js the workers of a multi-worker job (read on their own: the chart never waits for them), and
// thresholds.js the alert thresholds panel. Data from runs reaches the DOM only through
// textContent, and plotly only through `plotlyText`, which escapes markup.
//
// Example (what TensorBoard's iframe does):
//   import("./index.js").then((m) => m.render());

import {drawAlerts, drawRunCards} from "./cards.js";
import {drawChart, loadPlotly, preloadPlotly} from "./chart.js";
import {ROUTE, el} from "./dom.js";
import {pollForever, readRunData, readRuns, readWorkers, selectedRuns, staleRuns, workersSignature} from "./polling.js";
import {buildThresholdsPanel, loadThresholds, noteRuns, onThresholdsChange} from "./thresholds.js";
import {drawWorkers, redrawWorkers} from "./workers.js";
import "./preview.js"; // chart.js's: named here too, so the page fetches it with the others, not after chart.js

const state = {runs: [], labels: null, selected: ["", ""], view: null, results: new Map(), written: new Map(),
  statuses: "", workers: ""}; // workers: the signature of the /workers answer drawn or being read
const ui = {};

export async function render() {
  buildSkeleton();
  onThresholdsChange(() => { // the gpu_util_low line follows the saved thresholds; the rules' units come with them
    updateChart();
    drawAlerts(ui.alerts, selectedRuns(state), state.results);
  });
  // plotly.js (the largest file the tab loads) is fetched while the data is read, and run once the first data is
  // drawn: until then the chart is drawn without it (preview.js)
  preloadPlotly();
  let plotly = null;
  const startPlotly = () => plotly ??= loadPlotly().then(() => {
    updateChart();
    redrawWorkers();
  }, (error) => showMessage("error", "The chart library could not be loaded", [String(error.message || error)]));
  await pollForever(() => Promise.all([poll(), loadThresholds()]).finally(() => void startPlotly()));
}

async function poll() {
  try {
    await readRuns(state);
  } catch (error) {
    showMessage("error", "Cannot read the run list from TensorBoard", [String(error.message || error)]);
    return;
  }
  noteRuns(state.runs);
  ui.controls.hidden = !state.runs.length;
  updateSelectors();
  if (!state.runs.length) {
    showEmptyState();
    return;
  }
  hideMessage();
  updateWorkers(); // not awaited: the run's chart and cards never wait for its job's workers
  const stale = staleRuns(state);
  const statuses = selectedRuns(state).map((run) => `${run.run}:${run.status}`).join("|");
  if (stale.length) await refresh(stale.map((run) => run.run));
  else if (statuses !== state.statuses) updateCards();
  state.statuses = statuses;
}

async function refresh(names) {
  const width = document.documentElement.clientWidth; // the plot may be hidden (0 wide) before the first data
  await readRunData(state, names, width);
  updateCards();
  updateChart();
}

function updateCards() {
  const runs = selectedRuns(state);
  drawRunCards(ui.cards, runs, state.results);
  drawAlerts(ui.alerts, runs, state.results);
}

// Reads and draws /workers when the first selected run or its job's data changed since the last read.
async function updateWorkers() {
  const signature = workersSignature(state);
  if (signature === state.workers) return;
  state.workers = signature;
  const group = signature ? await readWorkers(state) : null;
  if (state.workers !== signature) return; // the selection or the job changed meanwhile: that read wins
  if (!group) state.workers = ""; // failed: read again at the next poll
  drawWorkers(ui.workers, group);
}

function updateChart() {
  const columns = selectedRuns(state).map((run) => state.results.get(run.run)).filter((r) => r?.timeline);
  drawChart(ui.plot, columns, {runs: state.runs, labels: state.labels, view: state.view, onZoom: setView});
}

function setView(view) {
  state.view = view && view[1] > view[0] ? [Math.max(0, view[0]), view[1]] : null;
  clearTimeout(ui.viewTimer);
  ui.viewTimer = setTimeout(() => refresh(selectedRuns(state).map((run) => run.run)), 150);
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
  app.append(header, thresholds.section, ui.message, ui.cards, ui.plot, ui.workers, ui.alerts);
  document.body.append(app);
  for (const [index, select] of [ui.runA, ui.runB].entries()) {
    select.addEventListener("change", () => {
      state.selected[index] = select.value;
      if (index === 0 && state.selected[1] === select.value) state.selected[1] = "";
      updateSelectors();
      updateWorkers();
      refresh(selectedRuns(state).map((run) => run.run));
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
