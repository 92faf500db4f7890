// The chart's first view: the figure chart.js builds for plotly, drawn on a canvas while plotly.js is still
// loading (a fresh page spends ~0.4 s running it, then ~0.3 s on its first drawing). The same rows, columns, lines,
// bands and shaded phases, with each row's title and the time axis' labels; no hover, zoom or legend. Plotly's
// drawing replaces it. Only what the tab's figures use is drawn: lines (with gaps at nulls, dashed or filled
// "toself"), stacked bars, rectangles and lines among layout shapes, and text annotations.
//
// Example:
//   drawPreview(plot, {data, layout});   // a <canvas class="rm-preview"> in `plot`, until Plotly.react draws there

export function drawPreview(plot, figure) {
  const {layout} = figure;
  const width = plot.clientWidth || document.documentElement.clientWidth;
  const canvas = plot.querySelector("canvas.rm-preview") || plot.appendChild(document.createElement("canvas"));
  canvas.className = "rm-preview";
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(layout.height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${layout.height}px`;
  const context = canvas.getContext("2d");
  context.scale(ratio, ratio);
  context.font = `11px ${layout.font.family}`;
  const frame = {x: layout.margin.l, y: layout.margin.t, w: width - layout.margin.l - layout.margin.r,
    h: layout.height - layout.margin.t - layout.margin.b};
  const scales = axisScales(figure, frame);
  const at = (ref, value, axis) => place(ref, value, axis, scales, frame);
  for (const shape of layout.shapes) if (shape.layer === "below") drawShape(context, shape, at);
  for (const scale of Object.values(scales)) (scale.y ? drawRowFrame : drawTimeAxis)(context, scale, layout);
  const bases = new Map(); // stacked bars: the top so far at each x, per axis
  for (const trace of figure.data) drawTrace(context, trace, scales, bases);
  for (const shape of layout.shapes) if (shape.layer !== "below") drawShape(context, shape, at);
  context.fillStyle = layout.font.color;
  for (const note of layout.annotations) {
    context.textAlign = "center";
    context.fillText(plainText(note.text), at(note.xref, note.x, "x"), at(note.yref, note.y, "y") - 4);
  }
  canvas.dataset.traces = String(figure.data.length);
}

// Each axis of the layout, as a function from data to pixels; x axes share the range of the axes they match.
function axisScales(figure, frame) {
  const {layout} = figure;
  const extent = new Map(); // axis name ("x2", "y3") → [min, max] of the data on it
  const stacks = new Map(); // y axis name → x → the top of the bars stacked there so far
  const widen = (axis, values) => {
    const span = extent.get(axis) || [Infinity, -Infinity];
    for (const v of values) {
      if (v !== null && Number.isFinite(v)) [span[0], span[1]] = [Math.min(span[0], v), Math.max(span[1], v)];
    }
    extent.set(axis, span);
  };
  const markers = new Set(); // x axes with a trace drawn with markers
  for (const trace of figure.data) {
    const yaxis = trace.yaxis || "y";
    widen(trace.xaxis || "x", trace.x || []);
    if (String(trace.mode).includes("markers")) markers.add(matched(layout, trace.xaxis || "x"));
    if (trace.type !== "bar") {
      widen(yaxis, trace.y || []);
      continue;
    }
    const stack = stacks.get(yaxis) || stacks.set(yaxis, new Map()).get(yaxis);
    widen(yaxis, trace.x.map((x, i) => stack.set(x, (stack.get(x) || 0) + (trace.y[i] ?? 0)).get(x)));
  }
  const scales = {};
  for (const [key, axis] of Object.entries(layout)) {
    const found = /^([xy])axis(\d*)$/.exec(key);
    if (!found) continue;
    const name = `${found[1]}${found[2]}`;
    const group = [...extent.keys()].filter((other) => matched(layout, other) === matched(layout, name));
    const span = [Math.min(...group.map((other) => extent.get(other)[0])),
      Math.max(...group.map((other) => extent.get(other)[1]))];
    let range = axis.range ? [...axis.range] : span;
    if (!axis.range && found[1] === "x" && markers.has(matched(layout, name))) { // room for the markers, as plotly
      range = [range[0] - 0.05 * (range[1] - range[0]), range[1] + 0.05 * (range[1] - range[0])];
    }
    if (!axis.range && axis.rangemode === "tozero") range = [Math.min(0, range[0]), Math.max(0, range[1]) * 1.05];
    if (!(range[1] > range[0])) range = [0, 1];
    const [d0, d1] = axis.domain || [0, 1];
    scales[name] = found[1] === "x"
      ? {x: true, range, at: (v) => frame.x + frame.w * (d0 + (d1 - d0) * (v - range[0]) / (range[1] - range[0])),
        axis}
      : {y: true, range, title: axis.title?.text,
        at: (v) => frame.y + frame.h * (1 - d0 - (d1 - d0) * (v - range[0]) / (range[1] - range[0])), axis};
  }
  return scales;
}

// The axis whose range `name` ("x3") shares: the one it matches, else itself.
function matched(layout, name) {
  return layout[name.replace(/^([xy])/, "$1axis")]?.matches || name;
}

// A layout position in pixels: `ref` is "paper", an axis ("x2") or an axis' domain ("x2 domain").
function place(ref, value, letter, scales, frame) {
  if (ref === "paper") return letter === "x" ? frame.x + frame.w * value : frame.y + frame.h * (1 - value);
  const [axis, domain] = ref.split(" ");
  const scale = scales[axis];
  if (!domain) return scale.at(value);
  const [d0, d1] = scale.axis.domain || [0, 1];
  const fraction = d0 + (d1 - d0) * value;
  return letter === "x" ? frame.x + frame.w * fraction : frame.y + frame.h * (1 - fraction);
}

function drawRowFrame(context, scale, layout) {
  const top = scale.at(scale.range[1]);
  const bottom = scale.at(scale.range[0]);
  context.strokeStyle = "#cbd5e1";
  context.lineWidth = 1;
  context.beginPath();
  context.moveTo(layout.margin.l, top);
  context.lineTo(layout.margin.l, bottom);
  context.stroke();
  if (scale.title) {
    context.save();
    context.fillStyle = layout.font.color;
    context.textAlign = "center";
    context.translate(layout.margin.l - 40, (top + bottom) / 2);
    context.rotate(-Math.PI / 2);
    context.fillText(scale.title, 0, 0);
    context.restore();
  }
}

// A time axis that shows its tick labels (the bottom row's): about five round values, as plotly labels them
// ("5k s"), and its title.
function drawTimeAxis(context, scale, layout) {
  if (!scale.axis.showticklabels) return;
  const [lo, hi] = scale.range;
  const rough = (hi - lo) / 5;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = power * ([1, 2, 5, 10].find((m) => m * power >= rough) || 10);
  const y = layout.height - layout.margin.b + 14;
  context.fillStyle = layout.font.color;
  context.textAlign = "center";
  for (let value = Math.ceil(lo / step) * step; step > 0 && value <= hi; value += step) { // step: never 0 or NaN
    const text = Math.abs(value) >= 1000 ? `${Number((value / 1000).toFixed(3))}k` : `${Number(value.toFixed(6))}`;
    context.fillText(`${text}${scale.axis.ticksuffix || ""}`, scale.at(value), y);
  }
  context.fillText(scale.axis.title?.text || "", scale.at((lo + hi) / 2), y + 14);
}

function drawTrace(context, trace, scales, bases) {
  const sx = scales[trace.xaxis || "x"];
  const sy = scales[trace.yaxis || "y"];
  if (!sx || !sy || !trace.x) return;
  if (trace.type === "bar") {
    const base = bases.get(trace.yaxis) || bases.set(trace.yaxis, new Map()).get(trace.yaxis);
    context.fillStyle = trace.marker?.color || "#2563eb";
    trace.x.forEach((x, i) => {
      const half = (trace.width?.[i] ?? 0) / 2;
      const from = base.get(x) || 0;
      const to = from + (trace.y[i] ?? 0);
      base.set(x, to);
      context.fillRect(sx.at(x - half), sy.at(to), Math.max(1, sx.at(x + half) - sx.at(x - half)),
        sy.at(from) - sy.at(to));
    });
    return;
  }
  if (!String(trace.mode).includes("lines")) return; // markers only: the tab's carry hover text, drawn invisible
  context.beginPath();
  let open = false;
  trace.x.forEach((x, i) => {
    const y = trace.y[i];
    if (x === null || y === null || y === undefined) {
      open = false;
      return;
    }
    if (open) context.lineTo(sx.at(x), sy.at(y));
    else context.moveTo(sx.at(x), sy.at(y));
    open = true;
  });
  if (trace.fill === "toself") {
    context.fillStyle = trace.fillcolor;
    context.fill();
  }
  const width = trace.line?.width ?? 2;
  if (width > 0) {
    context.strokeStyle = trace.line?.color || "#334155";
    context.lineWidth = width;
    context.setLineDash(trace.line?.dash === "dot" ? [2, 3] : trace.line?.dash === "dash" ? [6, 4] : []);
    context.stroke();
    context.setLineDash([]);
  }
}

function drawShape(context, shape, at) {
  const x0 = at(shape.xref, shape.x0, "x");
  const x1 = at(shape.xref, shape.x1, "x");
  const y0 = at(shape.yref, shape.y0, "y");
  const y1 = at(shape.yref, shape.y1, "y");
  context.save();
  context.globalAlpha = shape.opacity ?? 1;
  if (shape.type === "rect") {
    context.fillStyle = shape.fillcolor;
    context.fillRect(Math.min(x0, x1), Math.min(y0, y1), Math.max(1, Math.abs(x1 - x0)), Math.abs(y1 - y0));
  } else if (shape.type === "line") {
    context.strokeStyle = shape.line.color;
    context.lineWidth = shape.line.width;
    context.setLineDash(shape.line.dash === "dash" ? [6, 4] : []);
    context.beginPath();
    context.moveTo(x0, y0);
    context.lineTo(x1, y1);
    context.stroke();
  }
  context.restore();
}

// An annotation's text as plotly shows it: markup gone, escapes (plotlyText) undone; canvas text is never parsed.
function plainText(text) {
  return String(text).replace(/<br>/g, " ").replace(/<[^>]*>/g, "").replace(/&lt;/g, "<").replace(/&gt;/g, ">")
    .replace(/&amp;/g, "&");
}
