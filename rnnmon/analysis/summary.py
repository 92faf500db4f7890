"""Turns one run's record into the numbers a person reads: fractions, percentiles, GPUs, gaps, verdict.

Fractions are of training wall time: step time + host gaps + evaluation and epoch-end phases. Each fit's
first step (tracing, iterator creation) is its warm-up: counted in `steps`, reported as `warmup_s`, left out
of everything else. The verdict (rnnmon.analysis.verdict) uses shares of step time (step + host gap): a profiler
starting, or stopping and saving its trace, is neither but a profile phase (`profile_s`, and in `time_s`).
`time_s` accounts for the fits' whole wall time, warm-up included, part by part, and `slow_steps` names the
steps far above the median (rnnmon.analysis.fit_time). `training_without_s` is the quantity every measured
finding's speed-up predicts: the fits' training time (wall time after the warm-up) without one cause.

Where the input pipeline caches (`input_cache`), the first epoch of each fit fills the cache and waits for what
comes before it; with later epochs to judge, the input share, its speed-up and the verdict are theirs, and the
first epochs' wait is reported apart (`cache_fill`).

Example:
    >>> summary = summarize(runs["exp1/rnnmon"])
    >>> summary["verdict"], summary["input_wait_fraction"]
    ('input-bound', 0.61)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rnnmon.analysis.callback_time import callback_hooks_s, callback_ms_per_step
from rnnmon.analysis.fit_time import fit_time, training_without
from rnnmon.analysis.imbalance import device_imbalance
from rnnmon.analysis.input_share import pipeline_wait_s, robust_share
from rnnmon.analysis.measured import measured_findings, summary_line
from rnnmon.analysis.pipeline_context import in_measured_context
from rnnmon.analysis.verdict import verdict
from rnnmon.findings import Finding, rank_findings, training_speedup
from rnnmon.format import schema
from rnnmon.format.reader import RunData

LONGEST_GAPS = 20  # gaps listed one by one in a summary; `gap_list` gives all of them
GAP_HISTOGRAM_MS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000, 300000, math.inf)
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
_STAT = {name: i for i, name in enumerate(schema.STAT_COLUMNS)}


def summarize(run: RunData) -> dict[str, Any]:
    """The report's dictionary for one run (see `rnnmon report --json`)."""
    kept = ~np.isnan(run.steps[:, _S["host_gap_ms"]])  # each fit's first step: tracing, iterator creation
    column = {name: run.steps[:, _S[name]][kept]  # column by column: no copy of the whole table
              for name in ("begin", "end", "input_wait_ms", "host_gap_ms", "batches")}
    batches = column["batches"]
    duration = column["end"] - column["begin"]
    wait = column["input_wait_ms"] / 1e3
    gap = column["host_gap_ms"] / 1e3
    phase_s = {kind: float(np.sum((run.phases[:, 2] - run.phases[:, 1])[run.phases[:, 0] == k]))
               for k, kind in enumerate(schema.PHASE_KINDS)}
    step_total = float(duration.sum() + gap.sum())
    wall = step_total + phase_s["eval"] + phase_s["epoch_end"]
    measured = bool(len(wait)) and not np.isnan(wait).all()
    floor_s = float(run.info.get("fetch_floor_ms") or math.nan) / 1e3
    per_batch_ms = 1e3 * duration / np.maximum(batches, 1)
    cache = run.info.get("input_cache")  # where the pipeline caches: its first epoch fills the cache
    filling = _first_epochs(run.steps)[kept] if cache else np.zeros(len(duration), dtype=bool)
    split = measured and bool(filling.any()) and not filling.all()  # then the input is judged on the epochs after
    if measured:  # the wait beyond the fetch floor, against each step with the gap before it
        beyond_floor_s, step_with_gap_s = pipeline_wait_s(wait, batches, floor_s), duration + gap
        judged = ~filling if split else np.ones(len(duration), dtype=bool)
    summary: dict[str, Any] = {
        "run": run.run,
        "backend": run.info.get("backend"),
        "status": run.info.get("status", "unknown"),
        "fits": run.fits,
        "trial": run.info.get("trial"),  # a KerasTuner trial's id, search and hyperparameters (rnnmon.analysis.trials)
        "steps": int(run.steps[:, _S["batches"]].sum()),
        "epochs": _epochs(run.steps),
        "wall_s": round(wall, 3),
        "warmup_s": round(phase_s["warmup"], 3),
        "step_ms": _percentiles(per_batch_ms),
        "input_wait_ms": _percentiles(1e3 * wait / np.maximum(batches, 1)) if measured else None,
        "input_wait_measured": run.info.get("input_wait", "measured" if measured else "not measured"),
        "input_kind": run.info.get("input_kind"),  # tf.data, DataLoader, PyDataset, generator; None: other
        "profile": run.info.get("profile"),  # the profile capture on alert (rnnmon.capture.profiling), or None
        "input_wait_fraction": _ratio(np.nansum(wait), wall) if measured else None,
        "host_gap_fraction": _ratio(gap.sum(), wall),
        "eval_fraction": _ratio(phase_s["eval"], wall),
        "epoch_end_fraction": _ratio(phase_s["epoch_end"], wall),
        "profile_s": round(phase_s["profile"], 3),  # profilers starting, and stopping and saving their traces
        "gpus": [_gpu(run, index) for index in sorted(set(run.util) | set(run.stats))],
        "idle_gap_count": len(run.gaps),
        "idle_gaps": longest_gaps(run.gaps, LONGEST_GAPS),
        "idle_by_cause_s": _idle_by_cause(run.gaps),
        "idle_gaps_by_cause": _gap_counts_by_cause(run.gaps),
        "idle_gap_histogram": _gap_histogram(run.gaps),
        "fetch_floor_ms": run.info.get("fetch_floor_ms"),
        "distributed_split_ms": run.info.get("distributed_split_ms"),  # of the floor: tf.distribute's split
        "partial_batch_ms": run.info.get("partial_batch_ms"),  # of the split: the partial-batch check
        "callback_ms_per_step": callback_ms_per_step(run),
        "callback_hooks_s": callback_hooks_s(run),
        "shares": {"input": robust_share(beyond_floor_s[judged], step_with_gap_s[judged]) if measured else None,
                   "host": _ratio(gap.sum(), step_total)},
        "input_cache": cache,
        "cache_fill": _cache_fill(cache, beyond_floor_s[filling], step_with_gap_s[filling]) if split
        else None,  # the first epoch of each fit, judged apart: it filled the cache
        "alerts": merge_alerts(run.alerts),
        "errors": run.errors,
        "notes": run.notes,
    }
    summary["time_s"], summary["slow_step_count"], summary["slow_steps"] = fit_time(
        run.steps, run.phases, run.shapes, floor_s)
    summary["training_without_s"] = training_without(
        summary["time_s"], float(np.nansum(beyond_floor_s[judged])) if measured else None,
        summary["callback_hooks_s"])  # with a cache, the wait of the epochs after the first: CACHE_FILL has the rest
    without_wait = summary["training_without_s"]["input_wait"]
    summary["input_speedup"] = (None if without_wait is None
                                else training_speedup(summary["time_s"]["training"], without_wait))
    input_wait_s = (summary["shares"]["input"] or 0.0) * step_total  # beyond the fetch floor, robust
    summary["verdict"] = verdict(len(duration), input_wait_s, gap.sum(), step_total)
    recorded = in_measured_context([Finding(**f) for f in run.findings if isinstance(f, dict) and _is_finding(f)],
                                   summary)
    dynamic = measured_findings(summary) + device_imbalance(summary)
    summary["findings"] = [f.to_dict() for f in rank_findings(recorded + dynamic)]
    summary["summary"] = summary_line(summary)
    return summary


def _cache_fill(stage: str, wait_s: np.ndarray, step_s: np.ndarray) -> dict[str, Any]:
    """The steps that filled the cache at `stage`: how many, their wait beyond the fetch floor, its share."""
    return {"stage": stage, "steps": len(wait_s), "wait_s": round(float(wait_s.sum()), 3),
            "input_share": robust_share(wait_s, step_s)}


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


def _is_finding(record: dict[str, Any]) -> bool:
    fields = set(Finding.__annotations__)
    return fields - {"speedup"} <= set(record) <= fields


def merge_alerts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per alert (rule, device, start, end, value, threshold, message) from its fire/resolve events."""
    alerts: dict[tuple, dict[str, Any]] = {}
    for event in events:
        key = (event.get("rule"), event.get("device"), event.get("start"))
        if event.get("state") == "firing" or key not in alerts:
            alerts.setdefault(key, {k: v for k, v in event.items() if k != "state"} | {"end": None})
        if event.get("state") == "resolved":
            alerts[key]["end"] = event.get("end")
    return sorted(alerts.values(), key=lambda a: a.get("start") or 0)


def _gpu(run: RunData, index: int) -> dict[str, Any]:
    util = run.util.get(index, np.empty((0, len(schema.UTIL_COLUMNS))))[:, 1]
    stats = run.stats.get(index, np.empty((0, len(schema.STAT_COLUMNS))))
    idle_pct = float(run.info.get("idle_pct", 5.0))
    device = run.devices.get(index, {})
    return {
        "index": index,
        "name": device.get("name", f"GPU {index}"),
        "utilization": device.get("utilization", "nvml"),  # or "gpm", "not reported on MIG", ...
        "util_mean": _round(float(util.mean())) if len(util) else None,
        "idle_fraction": _round(float((util <= idle_pct).mean())) if len(util) else None,
        "samples": len(util),
        "idle_by_cause_s": _idle_by_cause(run.gaps[run.gaps[:, 0] == index]),
        "memory_used_max_mib": _column_stat(stats, "memory_used_mib", np.nanmax),
        "memory_total_mib": _column_stat(stats, "memory_total_mib", np.nanmax),
        "power_mean_w": _column_stat(stats, "power_w", np.nanmean),
        "sm_activity_mean": _column_stat(stats, "sm_activity_pct", np.nanmean),
        "sm_occupancy_mean": _column_stat(stats, "sm_occupancy_pct", np.nanmean),
    }


def gap_list(gaps: np.ndarray) -> list[dict[str, Any]]:
    """Gap rows as dictionaries (device None for gaps from step phases), in the rows' order."""
    return [{"device": None if int(device) == schema.STEP_DEVICE else int(device), "start": round(float(start), 3),
             "end": round(float(end), 3), "duration_s": round(float(end - start), 4),
             "cause": schema.GAP_CAUSES[int(cause)]}
            for device, start, end, cause in gaps.tolist()]


def longest_gaps(gaps: np.ndarray, count: int) -> list[dict[str, Any]]:
    """The `count` longest gaps, longest first."""
    duration = gaps[:, 2] - gaps[:, 1]
    if len(gaps) > count:
        chosen = np.argpartition(-duration, count - 1)[:count]
        return gap_list(gaps[chosen[np.argsort(-duration[chosen], kind="stable")]])
    return gap_list(gaps[np.argsort(-duration, kind="stable")])


def _gap_counts_by_cause(gaps: np.ndarray) -> dict[str, dict[str, float]]:
    counts = np.bincount(gaps[:, 3].astype(np.int64), minlength=len(schema.GAP_CAUSES))
    seconds = _idle_by_cause(gaps)
    return {cause: {"count": int(counts[k]), "seconds": seconds[cause]} for k, cause in enumerate(schema.GAP_CAUSES)}


def _gap_histogram(gaps: np.ndarray) -> list[dict[str, Any]]:
    """Gap counts per duration bin (1-2-5 steps in ms); only bins that hold a gap."""
    counts, _ = np.histogram(1e3 * (gaps[:, 2] - gaps[:, 1]), bins=GAP_HISTOGRAM_MS)
    return [{"from_ms": GAP_HISTOGRAM_MS[i], "to_ms": None if math.isinf(GAP_HISTOGRAM_MS[i + 1])
             else GAP_HISTOGRAM_MS[i + 1], "count": int(n)} for i, n in enumerate(counts) if n]


def _idle_by_cause(gaps: np.ndarray) -> dict[str, float]:
    duration = gaps[:, 2] - gaps[:, 1]
    return {cause: round(float(duration[gaps[:, 3] == k].sum()), 3) for k, cause in enumerate(schema.GAP_CAUSES)}


def _column_stat(stats: np.ndarray, column: str, reduce: Any) -> float | None:
    values = stats[:, _STAT[column]]
    return None if not len(values) or np.isnan(values).all() else _round(float(reduce(values)))


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    values = values[~np.isnan(values)]  # fits without input timing mixed with fits with it
    if not len(values):
        return {"median": None, "p90": None}
    median, p90 = np.percentile(values, [50, 90])
    return {"median": _round(float(median)), "p90": _round(float(p90))}


def _ratio(part: float, whole: float) -> float | None:
    return _round(float(part) / whole) if whole > 0 else None


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)
