"""Turns one run's record into the numbers a person reads: fractions, percentiles, GPUs, gaps, verdict.

Fractions are of training wall time: step time + host gaps + evaluation and epoch-end phases. Each fit's
first step (tracing, iterator creation) is its warm-up: counted in `steps`, reported as `warmup_s`, left out
of everything else. The verdict (rnnmon.analysis.verdict) uses shares of step time (step + host gap): a profiler
starting, or stopping and saving its trace, is neither but a profile phase (`profile_s`, and in `time_s`).
`time_s` accounts for the fits' whole wall time, warm-up included, part by part, and `slow_steps` names the
steps far above the median (rnnmon.analysis.fit_time). `training_without_s` is the quantity every measured
finding's speed-up predicts: the fits' training time (wall time after the warm-up) without one cause.

Where only a sample of the steps had its input wait timed (TensorFlow with `steps_per_execution > 1`, see
rnnmon.capture.input_timing), the input share is judged on the timed steps, each against its batches at the
per-batch step time of all, and the wait in all (`input_wait_fraction`, `time_s["input_wait"]`, the speed-up) is
scaled up from the timed batches: `input_wait_coverage` is their share, and `verdict_note` says so; where none
was timed, `verdict_note` says the verdict leaves input out (rnnmon.analysis.input_coverage).

Where the input pipeline caches (`input_cache`), the first epoch of each fit fills the cache and waits for what
comes before it; with later epochs to judge, the input share, its speed-up and the verdict are theirs, and the
first epochs' wait is reported apart (`cache_fill`).

The large tables (steps, gaps, GPU samples) are read through their digest (rnnmon.format.digest), from the rows or
from the records beside a run's index: a run of at most 65,536 rows per table is summarized exactly; a longer one's
percentiles are within 0.54% and its robust input share is taken bucket by bucket (docs/format.md, "The run digest").

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
from rnnmon.analysis.compile_advice import compile_fixes
from rnnmon.analysis.digest_figures import device_figures, step_figures
from rnnmon.analysis.fit_time import training_without
from rnnmon.analysis.imbalance import device_imbalance
from rnnmon.analysis.input_coverage import input_wait_note
from rnnmon.analysis.measured import measured_findings, summary_line
from rnnmon.analysis.pipeline_context import in_measured_context
from rnnmon.analysis.verdict import verdict
from rnnmon.findings import Finding, rank_findings, training_speedup
from rnnmon.format import schema
from rnnmon.format.digest import GAP_HISTOGRAM_MS, GapDigest, RunDigest, longest
from rnnmon.format.reader import RunData

LONGEST_GAPS = 20  # gaps listed one by one in a summary; `gap_list` gives all of them


def summarize(run: RunData) -> dict[str, Any]:
    """The report's dictionary for one run (see `rnnmon report --json`): from the run's digest (read from its
    index, `run.digest`) or from its tables, through the same digest (`rnnmon.format.digest`)."""
    digest = run.digest if run.digest is not None else RunDigest.of(run.steps, run.gaps, run.util, run.stats)
    phase_s = {kind: float(np.sum((run.phases[:, 2] - run.phases[:, 1])[run.phases[:, 0] == k]))
               for k, kind in enumerate(schema.PHASE_KINDS)}
    floor_s = float(run.info.get("fetch_floor_ms") or math.nan) / 1e3
    cache = run.info.get("input_cache")  # where the pipeline caches: its first epoch fills the cache
    steps = step_figures(digest.steps, floor_s, cache, run.phases, run.shapes, run.compiles)
    measured = steps["measured"]
    step_total = steps["duration_s"] + steps["gap_s"]
    wall = step_total + phase_s["eval"] + phase_s["epoch_end"]
    gaps = digest.gaps
    summary: dict[str, Any] = {
        "run": run.run,
        "backend": run.info.get("backend"),
        "status": run.info.get("status", "unknown"),
        "fits": run.fits,
        "trial": run.info.get("trial"),  # a KerasTuner trial's id, search and hyperparameters (rnnmon.analysis.trials)
        "steps": steps["steps"],
        "epochs": steps["epochs"],
        "wall_s": round(wall, 3),
        "warmup_s": round(phase_s["warmup"], 3),
        "step_ms": steps["step_ms"],
        "input_wait_ms": steps["input_wait_ms"],
        "input_wait_measured": run.info.get("input_wait", "measured" if measured else "not measured"),
        "input_wait_coverage": steps["coverage"],  # the share of batches timed: below 1 where a sample was
        "input_kind": run.info.get("input_kind"),  # tf.data, DataLoader, PyDataset, generator; None: other
        "profile": run.info.get("profile"),  # the profile capture on alert (rnnmon.capture.profiling), or None
        "input_wait_fraction": _ratio(steps["wait_s"], wall) if measured else None,
        "host_gap_fraction": _ratio(steps["gap_s"], wall),
        "eval_fraction": _ratio(phase_s["eval"], wall),
        "epoch_end_fraction": _ratio(phase_s["epoch_end"], wall),
        "profile_s": round(phase_s["profile"], 3),  # profilers starting, and stopping and saving their traces
        "gpus": [_gpu(run, digest, index) for index in sorted(digest.devices)],
        "idle_gap_count": gaps.rows,
        "idle_gaps": _longest(gaps),
        "idle_by_cause_s": _idle_by_cause(gaps),
        "idle_gaps_by_cause": _gap_counts_by_cause(gaps),
        "idle_gap_histogram": _gap_histogram(gaps),
        "fetch_floor_ms": run.info.get("fetch_floor_ms"),
        "distributed_split_ms": run.info.get("distributed_split_ms"),  # of the floor: tf.distribute's split
        "partial_batch_ms": run.info.get("partial_batch_ms"),  # of the split: the partial-batch check
        "eager_probe": run.info.get("eager_probe"),  # a loop's step: the ops it dispatched from Python (EAGER_STEP)
        "callback_ms_per_step": callback_ms_per_step(run, int(digest.steps.batches)),  # per batch
        "callback_hooks_s": callback_hooks_s(run, int(digest.steps.batches)),
        "shares": {"input": steps["input_share"], "host": _ratio(steps["gap_s"], step_total)},
        "input_cache": cache,
        "cache_fill": steps["cache_fill"],  # the first epoch of each fit, judged apart: it filled the cache
        "alerts": merge_alerts(run.alerts),
        "errors": run.errors,
        "notes": run.notes,
    }
    summary["time_s"], summary["slow_step_count"], summary["slow_steps"] = (
        steps["time_s"], steps["slow_count"], steps["slow_steps"])
    if measured and steps["coverage"] < 1:  # the steps' wait in all, estimated from the timed ones
        summary["time_s"]["input_wait"] = round(steps["wait_s"], 4)
    summary["training_without_s"] = training_without(  # with a cache, the wait of the epochs after the first
        summary["time_s"], steps["beyond_floor_s"], summary["callback_hooks_s"])  # (CACHE_FILL has the rest)
    without_wait = summary["training_without_s"]["input_wait"]
    summary["input_speedup"] = (None if without_wait is None
                                else training_speedup(summary["time_s"]["training"], without_wait))
    input_wait_s = (summary["shares"]["input"] or 0.0) * step_total  # beyond the fetch floor, robust
    summary["compile_fixes"] = compile_fixes(run.shape_steps, run.compiles, summary["time_s"],
                                             run.info.get("input_batching"))
    summary["verdict"] = verdict(steps["kept"], input_wait_s, steps["gap_s"], step_total,
                                 summary["time_s"]["recompiles"], summary["time_s"]["training"])
    recorded = in_measured_context([Finding(**f) for f in run.findings if isinstance(f, dict) and _is_finding(f)],
                                   summary)
    dynamic = measured_findings(summary) + device_imbalance(summary)
    summary["findings"] = [f.to_dict() for f in rank_findings(recorded + dynamic)]
    summary["verdict_note"] = (None if summary["verdict"] == "insufficient-data"
                               else input_wait_note(summary["input_wait_measured"], steps["coverage"]))
    summary["summary"] = " ".join(filter(None, (summary_line(summary), summary["verdict_note"])))
    return summary


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


def _gpu(run: RunData, digest: RunDigest, index: int) -> dict[str, Any]:
    device = run.devices.get(index, {})
    return {"index": index,
            "name": device.get("name", f"GPU {index}"),
            "utilization": device.get("utilization", "nvml"),  # or "gpm", "not reported on MIG", ...
            **device_figures(digest.devices[index], float(run.info.get("idle_pct", 5.0))),
            "idle_by_cause_s": _idle_by_cause(digest.gaps, index)}


def gap_list(gaps: np.ndarray) -> list[dict[str, Any]]:
    """Gap rows as dictionaries (device None for gaps from step phases), in the rows' order."""
    return [{"device": None if int(device) == schema.STEP_DEVICE else int(device), "start": round(float(start), 3),
             "end": round(float(end), 3), "duration_s": round(float(end - start), 4),
             "cause": schema.GAP_CAUSES[int(cause)]}
            for device, start, end, cause in gaps.tolist()]


def longest_gaps(gaps: np.ndarray, count: int) -> list[dict[str, Any]]:
    """The `count` longest gaps, longest first (of equal ones, the first rows)."""
    return gap_list(gaps[longest(gaps, count)])


def _longest(gaps: GapDigest) -> list[dict[str, Any]]:
    table = gaps.table()
    return longest_gaps(gaps.longest if table is None else table, LONGEST_GAPS)


def _gap_counts_by_cause(gaps: GapDigest) -> dict[str, dict[str, float]]:
    table = gaps.table()
    if table is None:
        counts = [int(gaps.groups[gaps.groups[:, 1] == k, 2].sum()) for k in range(len(schema.GAP_CAUSES))]
    else:
        counts = np.bincount(table[:, 3].astype(np.int64), minlength=len(schema.GAP_CAUSES)).tolist()
    seconds = _idle_by_cause(gaps)
    return {cause: {"count": int(counts[k]), "seconds": seconds[cause]} for k, cause in enumerate(schema.GAP_CAUSES)}


def _gap_histogram(gaps: GapDigest) -> list[dict[str, Any]]:
    """Gap counts per duration bin (1-2-5 steps in ms); only bins that hold a gap."""
    table = gaps.table()
    counts = (gaps.histogram if table is None
              else np.histogram(1e3 * (table[:, 2] - table[:, 1]), bins=GAP_HISTOGRAM_MS)[0])
    return [{"from_ms": GAP_HISTOGRAM_MS[i], "to_ms": None if math.isinf(GAP_HISTOGRAM_MS[i + 1])
             else GAP_HISTOGRAM_MS[i + 1], "count": int(n)} for i, n in enumerate(counts) if n]


def _idle_by_cause(gaps: GapDigest, device: int | None = None) -> dict[str, float]:
    """Seconds of gaps per cause (of one device, or of all)."""
    table = gaps.table()
    if table is not None:
        rows = table if device is None else table[table[:, 0] == device]
        duration = rows[:, 2] - rows[:, 1]
        return {cause: round(float(duration[rows[:, 3] == k].sum()), 3) for k, cause in enumerate(schema.GAP_CAUSES)}
    groups = gaps.groups if device is None else gaps.groups[gaps.groups[:, 0] == device]
    return {cause: round(float(groups[groups[:, 1] == k, 3].sum()), 3) for k, cause in enumerate(schema.GAP_CAUSES)}


def _ratio(part: float, whole: float) -> float | None:
    return _round(float(part) / whole) if whole > 0 else None


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)
