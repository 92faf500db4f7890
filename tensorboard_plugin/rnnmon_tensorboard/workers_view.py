"""A multi-worker job's workers for `/workers`: each worker's figures and step-time bins, kept per version of its files.

A worker's figures are what the straggler search compares (`rnnmon.analysis.worker_figures`: a summary's figures,
from its steps, phases and GPU samples alone; its other tables are not read). A worker is read once per version of
its data (its event files' names, sizes and times, or the provider's tags); `/workers` then reads again only the
workers that changed, and answers from the job's last answer when none did: a job is kept in a `RunCache` (`Job`),
its version the list of its workers' versions. The worker x time view bins each worker's steps into FINE_BINS over
its own span when it is read; the job's view sums those into HEAT_BINS columns over the span of all workers, so no
worker's tables are kept.

Example:
    >>> entry = worker_entry(version, worker_reader(run).update_from_files(run_dir))   # once per version
    >>> heatmap([("worker-0", entry.bins), ("worker-1", other)])["wait_share"][1]
    [0.21, 0.19, ...]
    >>> job_answer("job", [("worker-0", "job/worker-0/rnnmon"), ...], entries)["straggler"]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rnnmon.analysis.stragglers import compare_workers
from rnnmon.analysis.worker_figures import READ_TAG_PREFIXES, READ_TAGS, worker_figures
from rnnmon.format import schema
from rnnmon.format.reader import RunData, RunReader

from .run_cache import Kept

FINE_BINS = 240  # per worker, over its own first to last step
HEAT_BINS = 60  # columns of the job's worker x time view
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}


@dataclasses.dataclass(frozen=True)
class StepBins:
    """A worker's steps summed per bin of equal width from `start` to `end` (Unix seconds)."""

    start: float
    end: float
    step_ms: np.ndarray  # compute + input wait, summed per bin
    wait_ms: np.ndarray  # input wait
    gap_ms: np.ndarray  # host gap before each step
    batches: np.ndarray


@dataclasses.dataclass(frozen=True)
class WorkerEntry:
    """One version of a worker: its figures (`worker_figures`) and bins, or why it is left out (`reason`)."""

    version: Any
    figures: dict[str, Any] | None = None
    bins: StepBins | None = None
    reason: str | None = None


def worker_reader(run: str) -> RunReader:
    """A reader of what a worker's entry needs of its run: the tables `worker_figures` reads, not the others."""
    return RunReader(run, tags=READ_TAGS, tag_prefixes=READ_TAG_PREFIXES)


def worker_entry(version: Any, data: RunData) -> WorkerEntry:
    """The entry of a worker's readable `data` at `version`."""
    return WorkerEntry(version, worker_figures(data), step_bins(data.steps))


@dataclasses.dataclass
class Job(Kept):
    """/workers' last answer for a multi-worker job and each worker's entry, kept while no worker changed."""

    answer: dict[str, Any] | None = None
    workers: dict[str, WorkerEntry] = dataclasses.field(default_factory=dict)


def job_answer(job: str, siblings: list[tuple[str, str]], entries: dict[str, WorkerEntry]) -> dict[str, Any]:
    """/workers' answer for a job from its workers' entries (`siblings`: (worker, run) in index order)."""
    figures, left_out = [], []
    for worker, name in siblings:
        entry = entries[name]
        if entry.figures is None:
            left_out.append({"worker": worker, "run": name, "reason": entry.reason})
            continue
        if not entry.figures["judged"]:  # compare_workers leaves it out
            left_out.append({"worker": worker, "run": name, "reason": "too few steps to compare"})
        figures.append(entry.figures)
    groups = compare_workers(figures)
    group = groups[0] if groups else {"job": job, "workers": [], "findings": []}
    straggler = next((f["where"] for f in group["findings"] if f["code"] == "STRAGGLER"), None)

    def first(row: dict[str, Any]) -> tuple[bool, float]:  # the straggler, then the longest stall per step
        return row["worker"] != straggler, -((row["input_wait_ms"] or 0.0) + row["host_gap_ms"])

    # `order`: the row's place by worker (worker-2 before worker-10), for the tab's sort by that column
    workers = sorted(({**row, "order": order} for order, row in enumerate(group["workers"])), key=first)
    bins = [(worker, entries[name].bins) for worker, name in siblings if entries[name].figures is not None]
    return {**group, "workers": workers, "straggler": straggler, "left_out": left_out, "heatmap": heatmap(bins)}


def step_bins(steps: np.ndarray) -> StepBins | None:
    """The steps table's timed steps (not a fit's first, which traces) in FINE_BINS bins; None without any."""
    kept = steps[~np.isnan(steps[:, _S["host_gap_ms"]])]
    if not len(kept):
        return None
    begin, end = kept[:, _S["begin"]], kept[:, _S["end"]]
    start, stop = float(begin.min()), float(end.max())
    width = max(stop - start, 1e-9) / FINE_BINS
    index = np.clip(((begin - start) / width).astype(int), 0, FINE_BINS - 1)
    weights = np.nan_to_num(np.column_stack([1e3 * (end - begin), kept[:, _S["input_wait_ms"]],
                                             kept[:, _S["host_gap_ms"]], kept[:, _S["batches"]]]))
    step_ms, wait_ms, gap_ms, batches = (np.bincount(index, weights=column, minlength=FINE_BINS)
                                         for column in weights.T)
    return StepBins(start, stop, step_ms, wait_ms, gap_ms, batches)


def heatmap(rows: list[tuple[str, StepBins | None]], columns: int = HEAT_BINS) -> dict[str, Any] | None:
    """The worker x time view: per worker (in `rows`' order) and column, the mean step in ms per batch and the
    input wait's share of step time plus host gap (null where a worker has no step); None without any bins.
    All workers at once: one array operation each, not one per worker (2,000 workers: 0.23 s in those)."""
    binned = [bins for _, bins in rows if bins is not None]
    if not binned:
        return None
    starts, ends = np.array([b.start for b in binned]), np.array([b.end for b in binned])
    start, stop = float(starts.min()), float(ends.max())
    width = max(stop - start, 1e-9) / columns
    centres = starts[:, None] + (np.arange(FINE_BINS) + 0.5) * (ends - starts)[:, None] / FINE_BINS
    column = np.clip(((centres - start) / width).astype(int), 0, columns - 1)
    cell = (column + columns * np.arange(len(binned))[:, None]).ravel()  # (worker, column), worker by worker
    sums = {name: np.bincount(cell, weights=np.concatenate([getattr(b, name) for b in binned]),
                              minlength=columns * len(binned)).reshape(len(binned), columns)
            for name in ("step_ms", "wait_ms", "gap_ms", "batches")}
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums["step_ms"] / sums["batches"]
        share = sums["wait_ms"] / (sums["step_ms"] + sums["gap_ms"])
    step_ms, wait_share = iter(_rounded(mean, sums["batches"], 3)), iter(_rounded(share, sums["batches"], 4))
    empty = [None] * columns
    return {"workers": [worker for worker, _ in rows], "start": start, "bin_s": width, "columns": columns,
            "step_ms": [empty if bins is None else next(step_ms) for _, bins in rows],
            "wait_share": [empty if bins is None else next(wait_share) for _, bins in rows]}


def _rounded(values: np.ndarray, batches: np.ndarray, digits: int) -> list[list[float | None]]:
    """Each row's values rounded, None where its column holds no batch or the value is not finite."""
    shown = (batches > 0) & np.isfinite(values)
    return [[round(v, digits) if ok else None for v, ok in zip(row, oks)]
            for row, oks in zip(values.tolist(), shown.tolist())]
