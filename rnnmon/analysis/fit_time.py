"""Where each fit's wall time went, part by part, and the steps far above the median, each with its cause.

Every moment of a fit, from `on_train_begin` to `on_train_end`, is in exactly one record: a warm-up phase (the
fit's first step: tracing, iterator creation; and its first validation batch), a step (its input wait inside),
the host gap before a step, or a validation, epoch-end or profile phase (a profiler starting, or stopping and
saving its trace). A fit's wall time is the span of its records
(from the start of the warm-up that holds its first step to its last record); the parts add up to it, and
`unaccounted` says by how much they do not.

A step far above the median (`SLOW_FACTOR` times the median step and `SLOW_MIN_S` more) is named: a step whose
batch had input shapes the fit had not stepped on before, and that took `RECOMPILE_FACTOR` times the median, compiled
the step again (JAX compiles per shape, TensorFlow with XLA too): its time beyond the median is a `recompiles`
part. A slow step whose input wait beyond the fetch floor is at least half its excess waited for the pipeline:
it stays a step, its wait in the input wait. Any other slow step's excess is `slow_steps`: rnnmon did not see its
cause (a retrace of another kind, garbage collection, the machine's load).

Example:
    >>> times, counts, slow = fit_time(run.steps, run.phases, run.shapes, floor_s=0.0003)
    >>> times["fit"], times["recompiles"]
    (8.2, 0.98)
    >>> slow[0]["cause"], slow[0]["shapes"]
    ('recompile', [[5, 16, 8], [5, 1]])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rnnmon.analysis.input_share import pipeline_wait_s
from rnnmon.format import schema

PARTS = ("warmup", "steps", "recompiles", "slow_steps", "host_gaps", "validation", "epoch_ends", "profiling")
SLOW_FACTOR, SLOW_MIN_S = 5.0, 0.05  # a slow step: 5x the median step of its batches, and 50 ms more
RECOMPILE_FACTOR, RECOMPILE_MIN_S = 2.0, 0.01  # a step on new input shapes that compiled: 2x and 10 ms more
LISTED = 20  # slow steps listed one by one, longest excess first
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
_KIND = {kind: k for k, kind in enumerate(schema.PHASE_KINDS)}
_SAME_S = 1e-4  # a shape record names the step that begins within this of its time (steps are stored to the µs)


def fit_time(steps: np.ndarray, phases: np.ndarray, shapes: list[dict[str, Any]],
             floor_s: float) -> tuple[dict[str, float], dict[str, int], list[dict[str, Any]]]:
    """{"fit", every part of `PARTS`, "input_wait" (inside "steps"), "unaccounted", "training" (the fit after its
    warm-up)} in seconds; the count of slow steps by cause; and the slow steps themselves, longest excess first."""
    gap = steps[:, _S["host_gap_ms"]] / 1e3
    kept = ~np.isnan(gap)  # each fit's first step lies inside its warm-up phase
    begin, end = steps[kept, _S["begin"]], steps[kept, _S["end"]]
    batches = np.maximum(steps[kept, _S["batches"]], 1)
    duration = end - begin
    wait = np.nan_to_num(steps[kept, _S["input_wait_ms"]] / 1e3)
    phase_s = {kind: float((phases[:, 2] - phases[:, 1])[phases[:, 0] == k].sum()) for kind, k in _KIND.items()}
    new_shape = _new_shape(begin, shapes)
    excess, cause = _slow(duration, batches, pipeline_wait_s(wait, batches, floor_s), new_shape)
    recompiles, slow = float(excess[cause == "recompile"].sum()), float(excess[cause == "unknown"].sum())
    times = {"fit": _fit_spans_s(steps, phases), "warmup": phase_s["warmup"],
             "steps": float(duration.sum()) - recompiles - slow, "recompiles": recompiles, "slow_steps": slow,
             "host_gaps": float(gap[kept].sum()), "validation": phase_s["eval"], "epoch_ends": phase_s["epoch_end"],
             "profiling": phase_s["profile"], "input_wait": float(wait.sum())}
    times["unaccounted"] = times["fit"] - sum(times[part] for part in PARTS)
    times["training"] = times["fit"] - times["warmup"]
    counts = {name: int((cause == name).sum()) for name in ("recompile", "input", "unknown")}
    return ({name: round(seconds, 4) for name, seconds in times.items()}, counts,
            _listed(steps[kept], duration, excess, cause, new_shape, shapes))


def training_without(times: dict[str, float], wait_beyond_floor_s: float | None,
                     callback_hooks_s: dict[str, float] | None) -> dict[str, float | None]:
    """The fits' training time (wall time after the warm-up) without each cause, as measured: what every measured
    finding's speed-up predicts.

    "input_wait": without the input wait beyond the fetch floor (None where it was not measured);
    "host_gaps": without the host gaps between steps; "callbacks": without the other callbacks' batch hooks (None
    where they were not timed); "recompiles", "validation": without those parts.
    """
    training = times["training"]
    without = {"input_wait": None if wait_beyond_floor_s is None else training - wait_beyond_floor_s,
               "host_gaps": training - times["host_gaps"],
               "callbacks": None if not callback_hooks_s else training - sum(callback_hooks_s.values()),
               "recompiles": training - times["recompiles"], "validation": training - times["validation"]}
    return {cause: None if seconds is None else round(max(seconds, 0.0), 4) for cause, seconds in without.items()}


def _new_shape(begin: np.ndarray, shapes: list[dict[str, Any]]) -> np.ndarray:
    """Per step: the index into `shapes` of the record made at its begin (new input shapes), else -1."""
    found = np.full(len(begin), -1)
    if not len(begin):
        return found
    order = np.argsort(begin, kind="stable")
    for index, record in enumerate(shapes):
        at = int(np.searchsorted(begin[order], record["time"]))
        near = [i for i in (at - 1, at) if 0 <= i < len(order)]
        best = min(near, key=lambda i: abs(begin[order[i]] - record["time"]))
        if abs(begin[order[best]] - record["time"]) <= _SAME_S:
            found[order[best]] = index
    return found


def _slow(duration: np.ndarray, batches: np.ndarray, wait_beyond_s: np.ndarray, new_shape: np.ndarray,
          median_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each step's time beyond the median step of its batches (`median_s` per batch, or these steps' median), and
    its cause: "recompile", "input", "unknown", or "" for a step that is not slow."""
    cause = np.full(len(duration), "", dtype=object)
    if not len(duration):
        return np.zeros(0), cause
    expected = (float(np.median(duration / batches)) if median_s is None else median_s) * batches
    excess = duration - expected
    recompiled = (new_shape >= 0) & (duration >= RECOMPILE_FACTOR * expected) & (excess >= RECOMPILE_MIN_S)
    slow = ~recompiled & (duration >= SLOW_FACTOR * expected) & (excess >= SLOW_MIN_S)
    cause[recompiled] = "recompile"
    cause[slow & (wait_beyond_s >= 0.5 * excess)] = "input"
    cause[slow & (wait_beyond_s < 0.5 * excess)] = "unknown"
    return excess, cause


def _listed(rows: np.ndarray, duration: np.ndarray, excess: np.ndarray, cause: np.ndarray, new_shape: np.ndarray,
            shapes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The slow steps, longest excess first (at most `LISTED`); recompiles with their shapes and the ones before."""
    records = sorted(shapes, key=lambda record: record["time"])
    listed = []
    for i in sorted(np.flatnonzero(cause != ""), key=lambda i: -excess[i])[:LISTED]:
        item = {"step": int(rows[i, _S["step"]]), "epoch": int(rows[i, _S["epoch"]]),
                "duration_s": round(float(duration[i]), 4), "excess_s": round(float(excess[i]), 4),
                "cause": str(cause[i])}
        if cause[i] == "recompile":
            record = shapes[new_shape[i]]
            before = [r for r in records if r["time"] < record["time"] - _SAME_S]
            item.update(shapes=record["shapes"], previous_shapes=before[-1]["shapes"] if before else None)
        listed.append(item)
    return listed


def _fit_spans_s(steps: np.ndarray, phases: np.ndarray) -> float:
    """The fits' summed wall time: each from the start of the warm-up holding its first step to its last record."""
    gap = steps[:, _S["host_gap_ms"]] / 1e3
    starts = np.r_[steps[:, _S["begin"]] - np.nan_to_num(gap), phases[:, 1]]
    ends = np.r_[steps[:, _S["end"]], phases[:, 2]]
    if not len(starts):
        return 0.0
    warmups = phases[phases[:, 0] == _KIND["warmup"]]
    fits = []
    for first_begin, first_end in steps[np.isnan(gap)][:, [_S["begin"], _S["end"]]]:
        holding = warmups[(warmups[:, 1] <= first_begin + _SAME_S) & (warmups[:, 2] >= first_end - _SAME_S), 1]
        fits.append(float(holding.min()) if len(holding) else first_begin)
    fit_starts = np.unique(fits) if fits else np.array([starts.min()])
    which = np.clip(np.searchsorted(fit_starts, starts + _SAME_S, side="right") - 1, 0, None)
    last = np.full(len(fit_starts), -math.inf)
    np.maximum.at(last, which, ends)
    first = np.full(len(fit_starts), math.inf)
    np.minimum.at(first, which, starts)
    held = np.isfinite(last)
    return float((last[held] - np.minimum(first[held], fit_starts[held])).sum())
