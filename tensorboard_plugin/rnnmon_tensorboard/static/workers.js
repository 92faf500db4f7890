// The workers of a multi-worker job (GET /workers): a table in /workers' order (the straggler first, then the
// longest stall per step) until a header click sorts it by that column (a second click reverses it), its first
// TOP_N rows until "Show all", the workers left out with the reason, and a worker x time view: mean step time
// against the job's median step, and input wait share, per time bin, a row per worker; the straggler's row is
// outlined and named however many rows there are. Worker names reach the DOM only through textContent and plotly
// only through `plotlyText`.
//
// Example:
//   drawWorkers(section, await getJson("workers", {run}));   // null hides the section

import {el, fixed, pct, plotlyText} from "./dom.js";

const TOP_N = 10;
// The step colours span at least this far either side of the job's median step: the report's STRAGGLER share
// (rnnmon/analysis/stragglers.py EXCESS_SHARE), so microseconds of noise stay white.
const MIN_SPREAD = 0.05;
const STRAGGLER_RED = "#d62728";
const ms = (value) => (value === null || value === undefined ? "n/a" : `${fixed(value, 2)} ms`);
const COLUMNS = [
  {key: "worker", title: "Worker", text: (row) => row.worker},
  {key: "step_ms", title: "Median step", text: (row) => ms(row.step_ms)},
  {key: "input_wait_ms", title: "Input wait", text: (row) => ms(row.input_wait_ms)},
  {key: "host_gap_fraction", title: "Host gap", text: (row) => pct(row.host_gap_fraction)},
  {key: "gpu_idle_fraction", title: "GPU idle", text: (row) => pct(row.gpu_idle_fraction)},
];
const view = {sort: null, descending: true, all: false}; // sort: a column's key; null: /workers' order
let shown = null; // [section, group] last drawn, redrawn on a header click or "Show all"

// Draws `group` (a /workers answer) into `section`; hidden without workers.
export function drawWorkers(section, group) {
  const leftOut = group?.left_out || [];
  section.hidden = !group?.workers?.length && !leftOut.length;
  shown = section.hidden ? null : [section, group];
  if (section.hidden) return;
  const table = el("table", "rm-alert-table rm-workers-table");
  const thead = el("thead");
  thead.append(headerRow());
  const tbody = el("tbody");
  const rows = sorted(group.workers);
  for (const row of view.all ? rows : rows.slice(0, TOP_N)) {
    const tr = el("tr", group.straggler === row.worker ? "rm-alert-firing" : "");
    tr.dataset.worker = row.worker;
    tr.append(...COLUMNS.map((column) => el("td", "", column.text(row))));
    tbody.append(tr);
  }
  for (const row of leftOut) {
    const tr = el("tr", "rm-worker-left-out");
    tr.dataset.worker = row.worker;
    const reason = el("td", "", `left out: ${row.reason}`);
    reason.colSpan = COLUMNS.length - 1;
    tr.append(el("td", "", row.worker), reason);
    tbody.append(tr);
  }
  table.append(thead, tbody);
  const head = el("div", "rm-alerts-head");
  const left = leftOut.length ? `, ${leftOut.length} left out` : "";
  const counts = `job ${group.job}, ${group.workers.length} workers${left}`;
  head.append(el("h2", "", "Workers"), el("span", "rm-muted", counts));
  const parts = [head];
  const straggler = group.findings.find((finding) => finding.where === group.straggler);
  if (straggler) parts.push(el("p", "rm-straggler", `${straggler.code} at ${straggler.where}: ${straggler.message}`));
  parts.push(table);
  if (rows.length > TOP_N) {
    const more = el("button", "rm-button rm-workers-more",
      view.all ? `Show the first ${TOP_N}` : `Show all ${rows.length} workers`);
    more.addEventListener("click", () => {
      view.all = !view.all;
      redrawWorkers();
    });
    parts.push(more);
  }
  const heat = el("div", "rm-workers-heatmap");
  heat.id = "rm-workers-heatmap";
  parts.push(heat);
  section.replaceChildren(...parts);
  drawHeatmap(heat, group.heatmap, group.straggler, median(group.workers.map((row) => row.step_ms)));
}

// The middle of the values that are numbers (the job's median step: the middle of its workers' medians); null
// without any.
function median(values) {
  const known = values.filter((value) => typeof value === "number").sort((a, b) => a - b);
  if (!known.length) return null;
  const middle = known.length >> 1;
  return known.length % 2 ? known[middle] : (known[middle - 1] + known[middle]) / 2;
}

// Draws the last group again (after a header click, "Show all", or plotly's arrival for the heatmap).
export function redrawWorkers() {
  if (shown) drawWorkers(...shown);
}

function headerRow() {
  const top = el("tr");
  for (const column of COLUMNS) {
    const active = view.sort === column.key;
    const th = el("th", "rm-sortable", `${column.title}${active ? (view.descending ? " \u25BE" : " \u25B4") : ""}`);
    th.dataset.sort = column.key;
    th.title = "Sort by this column; click again to reverse";
    th.setAttribute("aria-sort", active ? (view.descending ? "descending" : "ascending") : "none");
    th.addEventListener("click", () => {
      view.descending = active ? !view.descending : column.key !== "worker";
      view.sort = column.key;
      redrawWorkers();
    });
    top.append(th);
  }
  return top;
}

// The rows in the chosen order; workers without a value (n/a) last either way.
function sorted(rows) {
  if (view.sort === null) return rows;
  const sign = view.descending ? -1 : 1;
  if (view.sort === "worker") return [...rows].sort((a, b) => sign * (a.order - b.order)); // /workers' order by worker
  return [...rows].sort((a, b) => {
    const [x, y] = [a[view.sort], b[view.sort]];
    if (x === null || x === undefined) return y === null || y === undefined ? 0 : 1;
    if (y === null || y === undefined) return -1;
    return sign * (x - y);
  });
}

// Two heatmaps side by side, a row per worker (worker-0 on top), time bins across: the mean step per batch against
// the job's median step (white at the median, red slower, blue faster, over at least MIN_SPREAD either side), and
// the input wait's share of step time. The straggler's row is outlined across both and is the one row named when
// there are too many rows to name them all.
function drawHeatmap(node, heatmap, straggler, jobStepMs) {
  if (!window.Plotly || !heatmap || !jobStepMs) {
    node.hidden = true;
    return;
  }
  const y = heatmap.workers.map(plotlyText);
  const x = Array.from({length: heatmap.columns}, (_, i) => Number(((i + 0.5) * heatmap.bin_s).toFixed(2)));
  const relative = heatmap.step_ms.map((row) => row.map((value) => (value === null ? null : value / jobStepMs - 1)));
  const spread = Math.min(1, relative.flat().reduce((most, value) => Math.max(most, Math.abs(value ?? 0)),
    MIN_SPREAD));
  const common = {type: "heatmap", x, y, hoverongaps: false, colorbar: {thickness: 10, len: 0.9}};
  const data = [
    {...common, z: relative, customdata: heatmap.step_ms, zmin: -spread, zmax: spread,
      colorscale: [[0, "#2166ac"], [0.5, "#f7f7f7"], [1, "#b2182b"]], name: "step vs the job's median",
      xaxis: "x", yaxis: "y", colorbar: {...common.colorbar, x: 0.43, tickformat: "+.0%"},
      hovertemplate: "%{y} · %{x:.0f} s<br>step %{customdata:.2f} ms, %{z:+.1%} against the job's median" +
        "<extra></extra>"},
    {...common, z: heatmap.wait_share, colorscale: "YlOrRd", reversescale: true, zmin: 0, zmax: 1,
      name: "input wait share", xaxis: "x2", yaxis: "y2", colorbar: {...common.colorbar, x: 1.0, tickformat: ".0%"},
      hovertemplate: "%{y} · %{x:.0f} s<br>input wait %{z:.1%}<extra></extra>"},
  ];
  const row = straggler ? heatmap.workers.indexOf(straggler) : -1;
  const many = y.length > 32; // then only the straggler's row is named; hover names the others
  const named = many ? {tickmode: "array", tickvals: row >= 0 ? [y[row]] : [], ticktext: row >= 0 ? [y[row]] : []}
    : {};
  const tickfont = many && row >= 0 ? {size: 11, color: STRAGGLER_RED} : {size: 10};
  const yaxis = {autorange: "reversed", type: "category", tickfont, ...named};
  const layout = {
    height: Math.max(200, Math.min(640, 110 + 10 * y.length)), margin: {l: 80, r: 50, t: 30, b: 40},
    xaxis: {domain: [0, 0.4], title: {text: "s since the job's first step"}},
    xaxis2: {domain: [0.54, 0.965], title: {text: "s since the job's first step"}},
    yaxis, yaxis2: {...yaxis, anchor: "x2", showticklabels: false},
    shapes: row < 0 ? [] : [[0, 0.4], [0.54, 0.965]].map(([x0, x1]) => ({type: "rect", xref: "paper", yref: "y",
      x0, x1, y0: row - 0.5, y1: row + 0.5, line: {color: STRAGGLER_RED, width: 2}})),
    annotations: [
      {text: `Mean step against the job's median (${jobStepMs.toFixed(2)} ms)`, xref: "paper", yref: "paper", x: 0,
        y: 1.02, xanchor: "left", yanchor: "bottom", showarrow: false},
      {text: "Input wait share of the step", xref: "paper", yref: "paper", x: 0.54, y: 1.02, xanchor: "left",
        yanchor: "bottom", showarrow: false},
    ],
  };
  node.dataset.straggler = straggler || "";
  window.Plotly.react(node, data, layout, {responsive: true, displaylogo: false});
}
