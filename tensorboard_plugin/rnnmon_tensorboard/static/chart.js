// The tab's chart: one plotly figure whose subplots share a time axis, a column per compared run.
//
// A column has a utilization row per GPU with that GPU's idle gaps as bands, then step time (input wait + compute)
// and host gaps. Where no run shown measured a GPU's utilization (no GPU seen by NVML), the top row is the
// non-compute gaps found from step timing, on an axis without percentages: nothing there reads as a busy GPU. Phases (validation, epoch ends, warm-up) shade the column, the saved gpu_util_low threshold is a
// dashed line on each utilization row, and the run's alerts are red bands with a lane above 100% that carries
// their hover text. Names from runs reach plotly only through `plotlyText`, which escapes markup.
//
// Until plotly.js has loaded, the same figure is drawn by preview.js on a canvas.
//
// Example:
//   preloadPlotly();  // fetched now, run once loadPlotly() is called
//   drawChart(plot, [{timeline, summary}], {runs, view: null, onZoom: (view) => refetch(view)});  // the preview
//   await loadPlotly();
//   drawChart(plot, [{timeline, summary}], {runs, view: null, onZoom: (view) => refetch(view)});  // plotly's

import {ALERT_LIMIT, ROUTE, fixed, pct, plotlyText, short} from "./dom.js";
import {drawPreview} from "./preview.js";
import {currentThresholds, ruleSpec} from "./thresholds.js";

const PLOT_HEIGHT = 600;
const BAR_LIMIT = 600; // more steps than this in view: lines instead of stacked bars
const ALERT = {band: "rgba(220, 38, 38, 0.09)", color: "#dc2626", laneY: 108}; // laneY: above 100%
// Colours by gap cause and phase kind; their words come from /runs (`labels`), a kind without a colour is grey.
const CAUSE_COLORS = {input: "rgba(245, 158, 11, 0.45)", host: "rgba(139, 92, 246, 0.45)",
  eval: "rgba(20, 184, 166, 0.45)", other: "rgba(100, 116, 139, 0.45)", sync: "rgba(225, 29, 72, 0.45)",
  warmup: "rgba(148, 163, 184, 0.55)", epoch_end: "rgba(99, 102, 241, 0.45)"};
const PHASE_COLORS = {eval: "rgba(20, 184, 166, 0.10)", epoch_end: "rgba(99, 102, 241, 0.12)",
  warmup: "rgba(148, 163, 184, 0.22)", profile: "rgba(234, 88, 12, 0.18)"};
const GREY = "rgba(100, 116, 139, 0.3)";
const COLORS = {compute: "#2563eb", wait: "#f59e0b", host: "#8b5cf6", gpu: ["#0f766e", "#1d4ed8", "#be123c", "#7c3aed"]};
const GPU_DOMAIN = [0.62, 1.0]; // shared by one utilization row per GPU
const STEP_ROWS = [
  {title: "Step time (ms)", domain: [0.27, 0.56]},
  {title: "Host gap (ms)", domain: [0.0, 0.21]},
];

// Fetches plotly.js without running it: running it takes the page's only thread for ~0.4 s, so the tab runs it
// (loadPlotly) once its first data is drawn.
export function preloadPlotly() {
  const link = document.createElement("link");
  link.rel = "preload";
  link.as = "script";
  link.href = ROUTE("plotly.min.js");
  document.head.append(link);
}

export function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = ROUTE("plotly.min.js");
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => reject(new Error("plotly.min.js did not load; is the plotly package installed?"));
    document.head.append(script);
  });
}

// Draws `columns` (each a run's {timeline, summary}) into `plot`. `runs` are /runs' entries (names, live), `view`
// the zoomed [start, end] or null; `onZoom` is called with the view the user zooms to (null: the whole run).
export function drawChart(plot, columns, {runs, labels, view, onZoom}) {
  plot.hidden = !columns.length;
  if (!columns.length) {
    if (window.Plotly) window.Plotly.purge(plot);
    plot.querySelector("canvas.rm-preview")?.remove();
    return;
  }
  const rows = chartRows(columns);
  const figure = {data: [], layout: baseLayout(columns, rows, runs, view)};
  const legend = new Set();
  const chart = {rows, runs, labels: labels || {causes: {}, phases: {}}, view, count: columns.length,
    width: plot.clientWidth,
    once: (key) => (legend.has(key) ? false : (legend.add(key), true))}; // one legend entry per key
  columns.forEach((result, c) => addColumn(figure, result, c, chart));
  if (!window.Plotly) {
    try {
      drawPreview(plot, figure);
    } catch (error) { // a first view only: plotly draws the chart when it comes, and the tab's polling goes on
      console.warn("rnnmon: the chart's first view was not drawn", error);
    }
    return;
  }
  plot.querySelector("canvas.rm-preview")?.remove();
  const first = window.Plotly.react(plot, figure.data, figure.layout,
    {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"]});
  if (!plot.dataset.bound) {
    plot.dataset.bound = "1";
    first.then(() => plot.on("plotly_relayout", (event) => {
      const zoomed = zoomOf(event);
      if (zoomed !== undefined) onZoom(zoomed);
    }));
  }
  plot.dataset.view = view ? view.map((v) => v.toFixed(3)).join(",") : "all";
  plot.dataset.newest = String(Math.max(...columns.map((r) => r.timeline.origin + r.timeline.extent.end)));
}

// The view a plotly_relayout event asks for: [start, end], null for the whole run, undefined when it is no zoom.
function zoomOf(event) {
  const keys = Object.keys(event);
  if (keys.some((key) => /^xaxis\d*\.autorange$/.test(key))) return null;
  const lo = keys.find((key) => /^xaxis\d*\.range\[0\]$/.test(key));
  const hi = keys.find((key) => /^xaxis\d*\.range\[1\]$/.test(key));
  const whole = keys.find((key) => /^xaxis\d*\.range$/.test(key));
  if (lo && hi) return [Number(event[lo]), Number(event[hi])];
  if (whole) return event[whole].map(Number);
  return undefined;
}

function axisId(prefix, n) {
  return n === 1 ? prefix : `${prefix}${n}`;
}

// One utilization row per GPU (as many as the run with the most GPUs), on the shared time axis, then STEP_ROWS.
// Without a measured utilization in any column, one row of non-compute gaps (`measured: false`).
function chartRows(columns) {
  const gpus = columns.flatMap((result) => result.timeline.gpus);
  if (!gpus.some(measured)) {
    return [{title: gpus.length ? "Non-compute gaps (no util.)" : "Non-compute gaps (no GPU)",
      domain: GPU_DOMAIN, gpu: true, measured: false}, ...STEP_ROWS];
  }
  const count = Math.max(1, ...columns.map((result) => result.timeline.gpus.length));
  const [lo, hi] = GPU_DOMAIN;
  const gap = 0.02;
  const height = (hi - lo - gap * (count - 1)) / count;
  const first = columns[0]?.timeline.gpus || [];
  const gpuRows = Array.from({length: count}, (_, g) => ({
    title: count === 1 ? "GPU util (%) · idle gaps" : `GPU ${first[g]?.index ?? g} util (%)`,
    domain: [hi - (g + 1) * height - g * gap, hi - g * height - g * gap], gpu: true, measured: true}));
  return [...gpuRows, ...STEP_ROWS];
}

function measured(gpu) {
  return gpu.utilization === "nvml" || gpu.utilization === "gpm";
}

function baseLayout(columns, rows, runs, view) {
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
    const name = runs.find((run) => run.run === result.timeline.run)?.name || result.timeline.run;
    layout.annotations.push({text: plotlyText(name), xref: "paper", yref: "paper",
      x: x0 + width / 2, y: 1.0, yanchor: "bottom", showarrow: false, font: {size: 13, color: "#0f172a"}});
    rows.forEach((row, r) => {
      const n = r * count + c + 1;
      const xaxis = {domain: [x0, x0 + width], anchor: axisId("y", n), showgrid: true, gridcolor: "#eef2f7",
        zeroline: false, showticklabels: r === rows.length - 1, ticksuffix: " s", showline: true,
        linecolor: "#cbd5e1"};
      if (n > 1) xaxis.matches = "x";
      if (r === rows.length - 1) xaxis.title = {text: "time since run start (s)", standoff: 6};
      if (view) xaxis.range = [...view];
      else xaxis.autorange = true;
      const yaxis = {domain: row.domain, anchor: axisId("x", n), fixedrange: true, gridcolor: "#eef2f7",
        zeroline: false, showline: true, linecolor: "#cbd5e1", rangemode: "tozero"};
      if (c === 0) yaxis.title = {text: row.title, font: {size: 11}};
      if (c > 0) yaxis.matches = axisId("y", r * count + 1);
      if (row.gpu) {
        const top = r === 0 && lane ? 114 : 105;
        Object.assign(yaxis, {range: [0, top], tickvals: rows[1]?.gpu ? [0, 50, 100] : [0, 20, 40, 60, 80, 100]});
        if (!row.measured) Object.assign(yaxis, {tickvals: [], showticklabels: false, showgrid: false});
      }
      else yaxis.autorange = true;
      layout[axisId("xaxis", n)] = xaxis;
      layout[axisId("yaxis", n)] = yaxis;
    });
  });
  return layout;
}

// Column `c` of the chart: where its rows' axes are, which row a GPU's traces go on, and the narrowest band drawn.
function addColumn(figure, result, c, chart) {
  const timeline = result.timeline;
  const gpuCount = chart.rows.filter((row) => row.gpu).length;
  const gpuRow = new Map(timeline.gpus.map((gpu, i) => [gpu.index, Math.min(i, gpuCount - 1)]));
  const span = chart.view ? chart.view[1] - chart.view[0] : Math.max(timeline.extent.end, 1e-3);
  const column = {
    ref: (prefix, r) => axisId(prefix, r * chart.count + c + 1),
    axes: (r) => ({xaxis: column.ref("x", r), yaxis: column.ref("y", r)}),
    rowOf: (device) => (device === null ? 0 : gpuRow.get(device) ?? 0),
    gpuCount,
    minWidth: span / Math.max(300, chart.width / chart.count) * 1.5, // keep short gaps visible
  };
  addIdleGaps(figure, timeline.gaps, column, chart);
  addUtilization(figure, timeline.gpus, column, chart.once);
  noteUnmeasured(figure, timeline.gpus, column);
  addSteps(figure, timeline.steps, column, chart.once);
  addPhases(figure, timeline.phases, column, chart);
  addThresholdLine(figure, timeline.gpus, column, chart.once);
  addAlerts(figure, result, column, chart);
}

// Each GPU's idle gaps as bands by cause (a binned band's height is the share of its bucket that was idle), with
// invisible markers that carry the hover. Gaps from step timing (no GPU) go on the first row.
function addIdleGaps(figure, gaps, column, chart) {
  const causes = new Set([...Object.keys(chart.labels.causes), ...gaps.cause]); // the served order, then any other
  for (const cause of causes) for (let r = 0; r < column.gpuCount; r++) {
    const style = {label: chart.labels.causes[cause] ?? cause, color: CAUSE_COLORS[cause] ?? GREY};
    const xs = [];
    const ys = [];
    const mx = [];
    const my = [];
    const text = [];
    gaps.cause.forEach((kind, i) => {
      if (kind !== cause || column.rowOf(gaps.device[i]) !== r) return;
      const start = gaps.start[i];
      const end = Math.max(gaps.end[i], start + column.minWidth);
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
      showlegend: chart.once(`gap-${cause}`), ...column.axes(r)});
    figure.data.push({type: "scatter", mode: "markers", x: mx, y: my, marker: {opacity: 0, size: 10},
      text, hovertemplate: "%{text}<extra></extra>", showlegend: false, legendgroup: `gap-${cause}`,
      ...column.axes(r)});
  }
}

// Each GPU's utilization line and, where GPM measures it, its SM activity, dotted.
function addUtilization(figure, gpus, column, once) {
  gpus.forEach((gpu, i) => {
    const color = COLORS.gpu[i % COLORS.gpu.length];
    const label = `GPU ${gpu.index}`;
    figure.data.push({type: "scatter", mode: "lines", x: gpu.util.time, y: gpu.util.value, name: `${label} utilization`,
      line: {color, width: 1.5}, legendgroup: `gpu-${gpu.index}`, showlegend: once(`gpu-${gpu.index}`),
      hovertemplate: `${plotlyText(gpu.name)}<br>%{y:.0f}% at %{x:.2f} s<extra>${label}</extra>`,
      ...column.axes(column.rowOf(gpu.index))});
    if (gpu.sm_activity) {
      figure.data.push({type: "scatter", mode: "lines", x: gpu.sm_activity.time, y: gpu.sm_activity.value,
        name: `${label} SM activity`, line: {color, width: 1, dash: "dot"}, legendgroup: `sm-${gpu.index}`,
        showlegend: once(`sm-${gpu.index}`), hovertemplate: `SM activity %{y:.0f}% at %{x:.2f} s<extra>${label}</extra>`,
        ...column.axes(column.rowOf(gpu.index))});
    }
  });
}

// Without utilization (no GPU, or one whose utilization is not measured) the bands come from step timing: say so.
function noteUnmeasured(figure, gpus, column) {
  const unmeasured = gpus.filter((gpu) => !measured(gpu));
  if (gpus.length && !unmeasured.length) return;
  const text = gpus.length
    ? `GPU ${unmeasured[0].index}: utilization ${unmeasured[0].utilization}: bands are non-compute gaps from step timing`
    : "No GPU seen by NVML: bands are non-compute gaps from step timing";
  figure.layout.annotations.push({text,
    xref: `${column.ref("x", 0)} domain`, yref: `${column.ref("y", 0)} domain`, x: 0.5, y: 0.95, showarrow: false,
    font: {size: 11, color: "#64748b"}, bgcolor: "rgba(255,255,255,0.8)"});
}

// The step rows: per-step input wait + compute (stacked bars while few enough to tell apart), and host gaps.
function addSteps(figure, steps, column, once) {
  const stepRow = column.gpuCount;
  const bars = !steps.downsampled && steps.time.length <= BAR_LIMIT;
  const hover = (what) => `step %{customdata}<br>${what} %{y:.2f} ms at %{x:.2f} s<extra></extra>`;
  const series = (name, y, color, r, key) => {
    const trace = {name, y, customdata: steps.step, hovertemplate: hover(name), legendgroup: key,
      showlegend: once(key), ...column.axes(r)};
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
    figure.layout.annotations.push({text: "no training steps in this range", xref: `${column.ref("x", stepRow)} domain`,
      yref: `${column.ref("y", stepRow)} domain`, x: 0.5, y: 0.5, showarrow: false, font: {color: "#94a3b8"}});
  }
}

// Phases (validation, epoch ends, warm-up, a profiler's start or stop-and-save) shade the whole column; a binned one fades with its share.
function addPhases(figure, phases, column, chart) {
  phases.kind.forEach((kind, i) => {
    const style = {label: chart.labels.phases[kind] ?? kind, color: PHASE_COLORS[kind] ?? GREY};
    figure.layout.shapes.push({type: "rect", layer: "below", xref: column.ref("x", 0), yref: "paper",
      x0: phases.start[i], x1: Math.max(phases.end[i], phases.start[i] + column.minWidth),
      y0: chart.rows[chart.rows.length - 1].domain[0], y1: chart.rows[0].domain[1], fillcolor: style.color,
      opacity: Math.max(0.3, phases.share[i]), line: {width: 0}, name: style.label,
      legendgroup: `phase-${kind}`, showlegend: chart.once(`phase-${kind}`)});
  });
}

// The gpu_util_low threshold now saved (or the default) on each row of a measured utilization.
function addThresholdLine(figure, gpus, column, once) {
  const low = currentThresholds()?.gpu_util_low;
  if (!low?.enabled) return;
  new Set(gpus.filter(measured).map((gpu) => column.rowOf(gpu.index))).forEach((r) => {
    figure.layout.shapes.push({type: "line", layer: "above", xref: `${column.ref("x", r)} domain`,
      yref: column.ref("y", r), x0: 0, x1: 1, y0: low.pct, y1: low.pct,
      line: {color: ALERT.color, width: 1.2, dash: "dash"},
      label: {text: `gpu_util_low < ${short(low.pct)}%`, textposition: "end", yanchor: "bottom",
        font: {size: 10, color: ALERT.color}},
      name: "gpu_util_low threshold", legendgroup: "threshold", showlegend: once("threshold")});
  });
}

// Alerts as red bands across the column's rows, and a lane above 100% on the first row that carries the hover.
function addAlerts(figure, result, column, chart) {
  const timeline = result.timeline;
  const alerts = (result.summary?.alerts || []).slice(-ALERT_LIMIT);
  if (!alerts.length) return;
  const live = chart.runs.find((run) => run.run === timeline.run)?.live;
  const xs = [];
  const ys = [];
  const text = [];
  for (const alert of alerts) {
    const start = alert.start - timeline.origin; // Unix seconds to the chart's seconds since the run's start
    const end = Math.max(alert.end === null ? timeline.extent.end : alert.end - timeline.origin,
      start + column.minWidth);
    figure.layout.shapes.push({type: "rect", layer: "below", xref: column.ref("x", 0), yref: "paper", x0: start,
      x1: end, y0: chart.rows[chart.rows.length - 1].domain[0], y1: chart.rows[0].domain[1], fillcolor: ALERT.band,
      line: {width: 0}});
    const unit = ruleSpec(alert.rule).unit;
    const device = alert.device === null || alert.device === undefined ? "" : ` · GPU ${alert.device}`;
    const open = alert.end === null ? (live ? "now (firing)" : "end of data (unresolved)") : "";
    const span = `${fixed(start, 1)} s – ${open || `${fixed(end, 1)} s`}`;
    const first = String(alert.message || "").split(". ")[0].slice(0, 140);
    const label = `<b>${plotlyText(alert.rule)}</b>${device}<br>${short(alert.value)}${unit} ` +
      `(threshold ${short(alert.threshold)}${unit}) · ${span}<br>${plotlyText(first)}`;
    xs.push(start, (start + end) / 2, end, null);
    ys.push(ALERT.laneY, ALERT.laneY, ALERT.laneY, null);
    text.push(label, label, label, null);
  }
  figure.data.push({type: "scatter", mode: "lines+markers", x: xs, y: ys, text, name: "alert",
    line: {color: ALERT.color, width: 6}, marker: {size: 10, opacity: 0, color: ALERT.color},
    hovertemplate: "%{text}<extra></extra>", legendgroup: "alert", showlegend: chart.once("alert"),
    connectgaps: false, ...column.axes(0)});
}
