// Small helpers shared by the tab's modules: routes, elements built with textContent only, number formats.
//
// Example:
//   import {el, pct} from "./dom.js";
//   card.append(el("span", "rm-tile-value", pct(0.25)));   // "25.0%"

export const ROUTE = (name) => new URL(name, import.meta.url);
export const ALERT_LIMIT = 200; // alerts drawn and listed per run; `rnnmon report` has them all

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function pct(fraction) {
  return fraction === null || fraction === undefined ? "n/a" : `${(100 * fraction).toFixed(1)}%`;
}

export function fixed(value, digits) {
  return value === null || value === undefined ? "n/a" : Number(value).toFixed(digits);
}

// A number with up to `digits` decimals and no trailing zeros: 20, 12.5, 1.83.
export function short(value, digits = 1) {
  return value === null || value === undefined ? "n/a" : String(Number(Number(value).toFixed(digits)));
}

// Plotly reads a small HTML subset in labels; escape run and device names so they are shown, never parsed.
export function plotlyText(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// An error answer's text without TensorBoard's "Invalid argument: " style prefix.
export function errorText(text) {
  return String(text).replace(/^(Invalid argument|Permission denied|Not found): /, "");
}
