"""A multi-worker job's workers for `/workers`: each worker's summary and step-time bins, kept per version of its files.

A worker is summarized once per version of its data (its event files' names, sizes and times, or the provider's
tags); `/workers` then re-summarizes only the workers that changed, and answers from the job's last answer when
none did: a job is kept in a `RunCache` (`Job`), its version the list of its workers' versions. The worker x time
view bins each worker's steps into FINE_BINS over its own span when it is summarized; the job's view sums those
into HEAT_BINS columns over the span of all workers, so no worker's tables are kept.

Example:
    >>> bins = step_bins(run_data.steps)            # once per version of the worker's files
    >>> heatmap([("worker-0", bins), ("worker-1", other)])["wait_share"][1]
    [0.21, 0.19, ...]
    >>> job_answer("job", [("worker-0", "job/worker-0/rnnmon"), ...], entries)["straggler"]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rnnmon.analysis.stragglers import compare_workers
from rnnmon.format import schema

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
    """One version of a worker: its summary and bins, or why it is left out (`reason`)."""

    version: Any
    summary: dict[str, Any] | None = None
    bins: StepBins | None = None
    reason: str | None = None


@dataclasses.dataclass
class Job(Kept):
    """/workers' last answer for a multi-worker job and each worker's entry, kept while no worker changed."""

    answer: dict[str, Any] | None = None
    workers: dict[str, WorkerEntry] = dataclasses.field(default_factory=dict)


def job_answer(job: str, siblings: list[tuple[str, str]], entries: dict[str, WorkerEntry]) -> dict[str, Any]:
    """/workers' answer for a job from its workers' entries (`siblings`: (worker, run) in index order)."""
    summaries, left_out = [], []
    for worker, name in siblings:
        entry = entries[name]
        if entry.summary is None:
            left_out.append({"worker": worker, "run": name, "reason": entry.reason})
            continue
        if entry.summary["verdict"] == "insufficient-data":  # compare_workers leaves it out
            left_out.append({"worker": worker, "run": name, "reason": "too few steps to compare"})
        summaries.append(entry.summary)
    groups = compare_workers(summaries)
    group = groups[0] if groups else {"job": job, "workers": [], "findings": []}
    straggler = next((f["where"] for f in group["findings"] if f["code"] == "STRAGGLER"), None)

    def first(row: dict[str, Any]) -> tuple[bool, float]:  # the straggler, then the longest stall per step
        return row["worker"] != straggler, -((row["input_wait_ms"] or 0.0) + row["host_gap_ms"])

    # `order`: the row's place by worker (worker-2 before worker-10), for the tab's sort by that column
    workers = sorted(({**row, "order": order} for order, row in enumerate(group["workers"])), key=first)
    bins = [(worker, entries[name].bins) for worker, name in siblings if entries[name].summary is not None]
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

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(index, weights=np.nan_to_num(values), minlength=FINE_BINS)

    return StepBins(start, stop, total(1e3 * (end - begin)), total(kept[:, _S["input_wait_ms"]]),
                    total(kept[:, _S["host_gap_ms"]]), total(kept[:, _S["batches"]]))


def heatmap(rows: list[tuple[str, StepBins | None]], columns: int = HEAT_BINS) -> dict[str, Any] | None:
    """The worker x time view: per worker (in `rows`' order) and column, the mean step in ms per batch and the
    input wait's share of step time plus host gap (null where a worker has no step); None without any bins."""
    spans = [bins for _, bins in rows if bins is not None]
    if not spans:
        return None
    start, stop = min(b.start for b in spans), max(b.end for b in spans)
    width = max(stop - start, 1e-9) / columns
    step_ms, wait_share = [], []
    for _, bins in rows:
        if bins is None:
            step_ms.append([None] * columns)
            wait_share.append([None] * columns)
            continue
        centres = bins.start + (np.arange(FINE_BINS) + 0.5) * (bins.end - bins.start) / FINE_BINS
        column = np.clip(((centres - start) / width).astype(int), 0, columns - 1)
        sums = {name: np.bincount(column, weights=getattr(bins, name), minlength=columns)
                for name in ("step_ms", "wait_ms", "gap_ms", "batches")}
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = sums["step_ms"] / sums["batches"]
            share = sums["wait_ms"] / (sums["step_ms"] + sums["gap_ms"])
        step_ms.append(_rounded(mean, sums["batches"], 3))
        wait_share.append(_rounded(share, sums["batches"], 4))
    return {"workers": [worker for worker, _ in rows], "start": start, "bin_s": width, "columns": columns,
            "step_ms": step_ms, "wait_share": wait_share}


def _rounded(values: np.ndarray, batches: np.ndarray, digits: int) -> list[float | None]:
    return [round(float(v), digits) if n > 0 and np.isfinite(v) else None for v, n in zip(values, batches)]
