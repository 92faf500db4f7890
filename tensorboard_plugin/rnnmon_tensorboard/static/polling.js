// Reading the plugin's routes into the tab's state: the run list (/runs) at every poll, the selected runs'
// /timeline and /summary when they have new data or the view changes, and, on its own, /workers for a worker of a
// multi-worker job when any of the job's workers has new data (the chart never waits for it). TensorBoard's reload
// button never reaches the tab's iframe, so the tab polls on its own.
//
// Example:
//   await pollForever(async () => {
//     await readRuns(state);
//     await readRunData(state, staleRuns(state).map((run) => run.run), width);
//   });

import {ROUTE, errorText} from "./dom.js";

const POLL_MS = 1000; // /runs is cheap; with TensorBoard's reload and rnnmon's flush, a step shows within ~5 s

// Runs `tick` now and again POLL_MS after each time it ends, so slow answers never pile up.
export async function pollForever(tick) {
  const loop = async () => {
    await tick();
    setTimeout(loop, POLL_MS);
  };
  await loop();
}

async function getJson(name, params = {}) {
  const url = ROUTE(name);
  for (const [key, value] of Object.entries(params)) url.searchParams.set(key, value);
  const response = await fetch(url);
  if (!response.ok) throw new Error(errorText(await response.text()) || `${response.status} ${response.statusText}`);
  return response.json();
}

// The run list into `state.runs`, with the words for what runs record; throws when TensorBoard does not answer.
export async function readRuns(state) {
  const listing = await getJson("runs");
  state.runs = listing.runs;
  state.labels = listing.labels;
}

// The /runs entries of the selected runs, in order.
export function selectedRuns(state) {
  return state.selected.map((name) => state.runs.find((run) => run.run === name)).filter(Boolean);
}

// The selected runs written since their data was read.
export function staleRuns(state) {
  return selectedRuns(state).filter((run) => state.written.get(run.run) !== run.last_write);
}

// Each of the runs `names`: its timeline over the current view (about `width` points across the selected runs)
// and its summary, or the error, into `state.results`. A run read for a view that changed meanwhile is dropped: the
// read for the new view wins.
export async function readRunData(state, names, width) {
  const points = Math.max(200, Math.round(width / Math.max(1, selectedRuns(state).length)));
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
}

// What /workers answers changes with, for the first selected run: its name and its job's newest write; "" when it is
// no worker's run.
export function workersSignature(state) {
  const first = state.runs.find((run) => run.run === state.selected[0]);
  if (!first?.job) return ""; // not a worker's run
  const newest = Math.max(...state.runs.filter((run) => run.job === first.job).map((run) => run.last_write));
  return `${first.run}@${newest}`;
}

// /workers for the first selected run (null when it fails).
export function readWorkers(state) {
  return getJson("workers", {run: state.selected[0]}).catch(() => null);
}
