"""The summary's figures from a run's digest (`rnnmon.format.digest`): exact from the rows while the digest keeps
them, else from its aggregates (sums exact; percentiles from the buckets, within `digest.RELATIVE_ERROR`; the wait
beyond the fetch floor and the robust input share bucket by bucket; slow steps from the slowest kept whole). Where
only some steps had their wait timed (a sample), the input figures are the timed steps' (rnnmon.analysis.summary).

Example:
    >>> step_figures(digest.steps, floor_s, cache, phases, shapes, compiles)["step_ms"]
    {'median': 19.98, 'p90': 21.4}
    >>> device_figures(digest.devices[0], idle_pct=5.0)["util_mean"]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rnnmon.analysis.fit_time import PARTS, SLOW_FACTOR, SLOW_MIN_S, _fit_spans_s, _listed, _slow, fit_time, record_at
from rnnmon.analysis.input_share import OUTLIERS_FRACTION, OUTLIERS_MIN, pipeline_wait_s, robust_share
from rnnmon.format import schema
from rnnmon.format.digest import (
    BUCKETS,
    EDGES_MS,
    TOP,
    DeviceDigest,
    StepDigest,
    bucket_of,
    quantile,
)

_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
_STAT = {name: i for i, name in enumerate(schema.STAT_COLUMNS)}


def step_figures(digest: StepDigest, floor_s: float, cache: Any, phases: np.ndarray, shapes: list[dict[str, Any]],
                 compiles: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """What a summary takes from the steps (see `rnnmon.analysis.summary.summarize`)."""
    if digest.raw is not None:
        return _exact(np.concatenate(digest.raw) if digest.raw else np.empty((0, len(schema.STEP_COLUMNS))),
                      floor_s, cache, phases, shapes, compiles)
    return _approximate(digest, floor_s, cache, phases, shapes, compiles)

def _approximate(digest: StepDigest, floor_s: float, cache: Any, phases: np.ndarray,
                 shapes: list[dict[str, Any]], compiles: list[dict[str, Any]]) -> dict[str, Any]:
    duration_s, gap_s, wait_s, waited = digest.sums.tolist()
    measured = waited > 0
    floor_ms = 0.0 if math.isnan(floor_s) else 1e3 * floor_s
    hist = digest.wait_hist  # per half (later epochs, first epochs): count, wait s, batches, step + gap s
    timed = _timed(digest)  # the same of the steps whose wait was timed (all, or a sample)
    counts = timed[:, 0].sum(axis=0)
    filling_steps = int(hist[1, 0].sum()) if cache else 0
    split = measured and timed[0, 0].sum() > 0 and timed[1, 0].sum() > 0 and filling_steps > 0
    halves = (hist[0], timed[0]) if split else (hist.sum(axis=0), timed.sum(axis=0))
    share, beyond_s = _judged_buckets(*halves, floor_ms) if measured else (None, None)
    all_batches, timed_batches = float(hist[:, 2].sum()), float(timed[:, 2].sum())
    figures = {
        "steps": int(digest.batches), "epochs": digest.changes + 1 if digest.rows else 0, "kept": digest.kept,
        "duration_s": duration_s, "gap_s": gap_s, "wait_s": _scaled(wait_s, all_batches, timed_batches),
        "measured": measured, "coverage": _coverage(timed_batches, all_batches) if measured else None,
        "step_ms": _hist_percentiles(digest.step_hist[0]),
        "input_wait_ms": _hist_percentiles(counts) if measured else None,
        "input_share": share, "beyond_floor_s": beyond_s, "cache_fill": None}
    if split:
        share, beyond_s = _judged_buckets(hist[1], timed[1], floor_ms)
        figures["cache_fill"] = {"stage": cache, "steps": filling_steps, "wait_s": round(beyond_s, 3),
                                 "input_share": share}
    figures["time_s"], figures["slow_count"], figures["slow_steps"] = _fit_time(digest, floor_s, phases, shapes,
                                                                                compiles)
    return figures

def _timed(digest: StepDigest) -> np.ndarray:
    """The wait histogram without the steps whose wait was not timed (they lie in its bucket 0)."""
    timed = digest.wait_hist.copy()
    timed[:, 0, 0] -= digest.unwaited
    timed[:, 3, 0] -= digest.unwaited_sums[:, 0]
    timed[:, 2, 0] -= digest.unwaited_sums[:, 1]
    timed[:, :, 0] = np.maximum(timed[:, :, 0], 0.0)
    return timed


def _judged_buckets(every: np.ndarray, timed: np.ndarray, floor_ms: float) -> tuple[float | None, float]:
    """`_judged` over wait buckets: the robust share and the wait beyond the floor, from the histogram of `every`
    step and of the `timed` ones."""
    beyond = _beyond(timed, floor_ms)
    batches, timed_batches = float(every[2].sum()), float(timed[2].sum())
    against = timed[3] if timed[0].sum() == every[0].sum() else timed[2] * (float(every[3].sum()) / batches)
    return _robust(beyond, against, timed[0]), _scaled(float(beyond.sum()), batches, timed_batches)


def _fit_time(digest: StepDigest, floor_s: float, phases: np.ndarray, shapes: list[dict[str, Any]],
              compiles: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, int], list[dict[str, Any]]]:
    """`fit_time` from the fit boundaries, the sums and the slowest steps kept, against the median read from the
    step-time buckets less the steps that compiled; slow steps beyond those kept (more than `TOP`) are counted and
    timed from the buckets wholly above the slow threshold, their cause unknown."""
    n, m = len(digest.firsts), len(digest.stretches)
    outline = np.zeros((n + m, len(schema.STEP_COLUMNS)))
    outline[:n, _S["host_gap_ms"]] = np.nan  # each fit's first step, then one row spanning each stretch
    outline[:n, _S["begin"]], outline[:n, _S["end"]] = digest.firsts[:, 0], digest.firsts[:, 1]
    outline[n:, _S["begin"]], outline[n:, _S["end"]] = digest.stretches[:, 1], digest.stretches[:, 2]
    duration_s, gap_s, wait_s, _ = digest.sums.tolist()
    phase_s = {kind: float((phases[:, 2] - phases[:, 1])[phases[:, 0] == k].sum())
               for k, kind in enumerate(schema.PHASE_KINDS)}
    top = digest.top
    begin, batches = top[:, _S["begin"]], np.maximum(top[:, _S["batches"]], 1)
    duration = top[:, _S["end"]] - begin
    median_s = 1e-3 * quantile(_plain_counts(digest.step_hist[0], compiles), 0.5) if digest.kept else 0.0
    compiled = record_at(begin, compiles)
    wait = np.nan_to_num(top[:, _S["input_wait_ms"]] / 1e3)
    excess, cause = _slow(duration, batches, pipeline_wait_s(wait, batches, floor_s), compiled, compiles, median_s)
    recompiles, slow = float(excess[cause == "recompile"].sum()), float(excess[cause == "unknown"].sum())
    counts = {name: int((cause == name).sum()) for name in ("recompile", "input", "unknown")}
    if len(top) == TOP:  # the slow steps the top does not hold: in buckets wholly above the threshold
        threshold_ms = 1e3 * max(SLOW_FACTOR * median_s, median_s + SLOW_MIN_S)
        cut = int(bucket_of(np.array([threshold_ms]))[0]) + 1
        held = bucket_of(1e3 * duration / batches) >= cut
        rest = digest.step_hist[:, cut:].sum(axis=1) - (held.sum(), duration[held].sum(), batches[held].sum())
        if rest[0] > 0:
            counts["unknown"] += int(rest[0])
            slow += max(float(rest[1] - median_s * rest[2]), 0.0)
    times = {"fit": _fit_spans_s(outline, phases), "warmup": phase_s["warmup"],
             "steps": duration_s - recompiles - slow, "recompiles": recompiles, "slow_steps": slow,
             "host_gaps": gap_s, "validation": phase_s["eval"], "epoch_ends": phase_s["epoch_end"],
             "profiling": phase_s["profile"], "input_wait": wait_s}
    times["unaccounted"] = times["fit"] - sum(times[part] for part in PARTS)
    times["training"] = times["fit"] - times["warmup"]
    return ({name: round(seconds, 4) for name, seconds in times.items()}, counts,
            _listed(top, duration, excess, cause, compiled, compiles, shapes))


def _plain_counts(counts: np.ndarray, compiles: list[dict[str, Any]]) -> np.ndarray:
    """Steps per step-time bucket, less the steps that compiled (their per-batch time from their records), so that
    a median read from them is a normal step's even where most steps compiled; all steps where none is left."""
    if not compiles:
        return counts
    per_batch_ms = np.array([1e3 * c["duration_s"] / max(c.get("batches") or 1, 1) for c in compiles])
    plain = counts.astype(float).copy()
    np.subtract.at(plain, bucket_of(per_batch_ms), 1)
    plain = np.maximum(plain, 0)
    return plain if plain.sum() > 0 else counts

def _beyond(hist: np.ndarray, floor_ms: float) -> np.ndarray:
    """Per wait bucket: the wait beyond the fetch floor (s) of its steps."""
    beyond = np.maximum(hist[1] - 1e-3 * floor_ms * hist[2], 0.0)
    upper = EDGES_MS
    return np.where(upper <= floor_ms, 0.0, beyond)


def _robust(part: np.ndarray, whole: np.ndarray, counts: np.ndarray) -> float | None:
    """`robust_share` over wait buckets (ascending): the largest waits dropped bucket by bucket from the top, the
    bucket at the cut in proportion to its steps."""
    total = float(counts.sum())
    if total <= 0:
        return None
    drop = max(OUTLIERS_MIN, math.ceil(OUTLIERS_FRACTION * total))
    kept = np.ones(BUCKETS)
    if total > 2 * drop:
        above = np.cumsum(counts[::-1])[::-1] - counts  # steps in the buckets above each
        taken = np.clip(drop - above, 0, counts)
        kept = np.divide(counts - taken, counts, out=np.zeros(BUCKETS), where=counts > 0)
    whole_s = float((whole * kept).sum())
    return round(float((part * kept).sum()) / whole_s, 4) if whole_s > 0 else None


def _hist_percentiles(counts: np.ndarray) -> dict[str, float | None]:
    if counts.sum() <= 0:
        return {"median": None, "p90": None}
    return {"median": round(quantile(counts, 0.5), 4), "p90": round(quantile(counts, 0.9), 4)}


def _exact(steps: np.ndarray, floor_s: float, cache: Any, phases: np.ndarray, shapes: list[dict[str, Any]],
           compiles: list[dict[str, Any]]) -> dict[str, Any]:
    """The step figures from the whole step table."""
    kept = ~np.isnan(steps[:, _S["host_gap_ms"]])  # each fit's first step: tracing, iterator creation
    column = {name: steps[:, _S[name]][kept] for name in ("begin", "end", "input_wait_ms", "host_gap_ms", "batches")}
    batches = np.maximum(column["batches"], 1)
    duration = column["end"] - column["begin"]
    wait = column["input_wait_ms"] / 1e3
    gap = column["host_gap_ms"] / 1e3
    measured = bool(len(wait)) and not np.isnan(wait).all()
    filling = _first_epochs(steps)[kept] if cache else np.zeros(len(duration), dtype=bool)
    whole, timed = duration + gap, ~np.isnan(wait)  # timed: the steps whose wait was (all, or a sample)
    split = measured and bool((filling & timed).any()) and bool((~filling & timed).any())
    figures: dict[str, Any] = {
        "steps": int(steps[:, _S["batches"]].sum()), "epochs": _epochs(steps), "kept": len(duration),
        "duration_s": float(duration.sum()), "gap_s": float(gap.sum()),
        "wait_s": _scaled(float(np.nansum(wait)), float(batches.sum()), float(batches[timed].sum())),
        "measured": measured, "coverage": _coverage(batches[timed].sum(), batches.sum()) if measured else None,
        "step_ms": _percentiles(1e3 * duration / batches),
        "input_wait_ms": _percentiles(1e3 * wait / batches) if measured else None,
        "input_share": None, "beyond_floor_s": None, "cache_fill": None}
    if measured:  # the wait beyond the fetch floor, against each timed step with the gap before it
        beyond = pipeline_wait_s(wait, batches, floor_s)
        judged = ~filling if split else np.ones(len(duration), dtype=bool)
        figures["input_share"], figures["beyond_floor_s"] = _judged(beyond, judged, whole, batches, timed)
        if split:
            share, wait_s = _judged(beyond, filling, whole, batches, timed)
            figures["cache_fill"] = {"stage": cache, "steps": int(filling.sum()), "wait_s": round(wait_s, 3),
                                     "input_share": share}
    figures["time_s"], figures["slow_count"], figures["slow_steps"] = fit_time(steps, phases, shapes, floor_s,
                                                                               compiles)
    return figures


def _judged(beyond: np.ndarray, steps: np.ndarray, whole: np.ndarray, batches: np.ndarray,
            timed: np.ndarray) -> tuple[float | None, float]:
    """The robust input share of `steps` (a mask) and their wait beyond the floor, from the timed ones.

    Where every step was timed, each wait is a share of its own step time (step + host gap). Where only a sample
    was, of its batches at the per-batch step time of all `steps` (a timed execution runs slower than Keras's
    in-graph loop; its wait does not grow), and the wait is scaled from the timed batches to all.
    """
    chosen = steps & timed
    against = whole if chosen.sum() == steps.sum() else batches * (whole[steps].sum() / batches[steps].sum())
    return (robust_share(beyond[chosen], against[chosen]),
            _scaled(float(beyond[chosen].sum()), float(batches[steps].sum()), float(batches[chosen].sum())))


def _coverage(timed_batches: float, batches: float) -> float | None:
    """The share of the batches whose input wait was timed; None without batches."""
    return round(float(timed_batches) / float(batches), 4) if batches > 0 else None


def _scaled(timed_wait_s: float, batches: float, timed_batches: float) -> float:
    """A wait summed over `timed_batches` batches, scaled to `batches` (a sample's estimate of the whole; the
    sum itself where every batch was timed)."""
    return timed_wait_s * batches / timed_batches if timed_batches > 0 else timed_wait_s


def _first_epochs(steps: np.ndarray) -> np.ndarray:
    """A mask of the steps in the first epoch of their fit (a fit starts at a step without a host gap)."""
    starts = np.isnan(steps[:, _S["host_gap_ms"]])
    starts[:1] = True
    fit = np.cumsum(starts) - 1
    return steps[:, _S["epoch"]] == steps[starts, _S["epoch"]][fit]


def _epochs(steps: np.ndarray) -> int:
    """The epochs the steps ran in: a new one at each change of epoch and at each fit's first step."""
    if not len(steps):
        return 0
    epoch, first = steps[:, _S["epoch"]], np.isnan(steps[:, _S["host_gap_ms"]])
    return 1 + int(np.count_nonzero((epoch[1:] != epoch[:-1]) | first[1:]))


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    ordered = sorted(values[~np.isnan(values)].tolist())  # fits without input timing mixed with fits with it
    if not ordered:
        return {"median": None, "p90": None}
    return {"median": round(_percentile(ordered, 0.5), 4), "p90": round(_percentile(ordered, 0.9), 4)}


def _percentile(ordered: list[float], q: float) -> float:
    """`np.percentile(values, 100 * q)` of the values `ordered` ascending, by the same arithmetic (its linear
    method), without its cost per call (90 us: a job of 2,000 workers paid 0.4 s in it)."""
    at = (len(ordered) - 1) * q
    low = math.floor(at)
    below, above, weight = ordered[low], ordered[min(low + 1, len(ordered) - 1)], at - low
    return above - (above - below) * (1 - weight) if weight >= 0.5 else below + (above - below) * weight


def device_figures(digest: DeviceDigest, idle_pct: float) -> dict[str, Any]:
    """util_mean, idle_fraction, samples and the stats columns a summary shows."""
    if digest.raw is not None:
        util = _joined(digest.raw["util"], len(schema.UTIL_COLUMNS))[:, 1]
        stats = _joined(digest.raw["stats"], len(schema.STAT_COLUMNS))
        return {"util_mean": _round(float(util.mean())) if len(util) else None,
                "idle_fraction": idle_fraction(util, idle_pct),
                "samples": len(util),
                "memory_used_max_mib": _column_stat(stats, "memory_used_mib", np.nanmax),
                "memory_total_mib": _column_stat(stats, "memory_total_mib", np.nanmax),
                "power_mean_w": _column_stat(stats, "power_w", np.nanmean),
                "sm_activity_mean": _column_stat(stats, "sm_activity_pct", np.nanmean),
                "sm_occupancy_mean": _column_stat(stats, "sm_occupancy_pct", np.nanmean)}
    count = int(digest.util[0])
    idle = float(digest.util[2:2 + int(np.clip(math.floor(idle_pct), -1, 100)) + 1].sum())
    return {"util_mean": _round(digest.util[1] / count) if count else None,
            "idle_fraction": _round(idle / count) if count else None, "samples": count,
            "memory_used_max_mib": _round(digest.maximum("memory_used_mib")),
            "memory_total_mib": _round(digest.maximum("memory_total_mib")),
            "power_mean_w": _round(digest.mean("power_w")), "sm_activity_mean": _round(digest.mean("sm_activity_pct")),
            "sm_occupancy_mean": _round(digest.mean("sm_occupancy_pct"))}

def idle_fraction(util: np.ndarray, idle_pct: float) -> float | None:
    """The share of utilization samples (`util`, in %) at or below `idle_pct`; None without samples."""
    return _round(float((util <= idle_pct).mean())) if len(util) else None


def _joined(parts: list[np.ndarray], width: int) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty((0, width))


def _column_stat(stats: np.ndarray, column: str, reduce: Any) -> float | None:
    values = stats[:, _STAT[column]]
    return None if not len(values) or np.isnan(values).all() else _round(float(reduce(values)))


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(float(value), 4)
