"""Where each fit's wall time went, part by part, and the steps far above the median, each with its cause.

Every moment of a fit, from `on_train_begin` to `on_train_end`, is in exactly one record: a warm-up phase (the
fit's first step: tracing, iterator creation; and its first validation batch), a step (its input wait inside),
the host gap before a step, or a validation, epoch-end or profile phase (a profiler starting, or stopping and
saving its trace). A fit's wall time is the span of its records
(from the start of the warm-up that holds its first step to its last record); the parts add up to it, and
`unaccounted` says by how much they do not.

A step that compiled, by the framework's own signal (rnnmon.capture.compiles: JAX's compile events, a
`tf.function`'s tracing count, each new input signature under XLA, `torch.compile`'s graphs), spent its time
beyond a normal step compiling: the framework's measured compile seconds where it times them (JAX), else its time
beyond the median of the steps that compiled nothing (the steps on shapes already seen; where most steps compile,
the median of all steps would itself be a compile). That is the `recompiles` part; no step is a recompile without
a compile event. Any other step far above that median (`SLOW_FACTOR` times it and `SLOW_MIN_S` more) is named: one
whose input wait beyond the fetch floor is at least half its excess waited for the pipeline: it stays a step, its
wait in the input wait. Any other slow step's excess is `slow_steps`: rnnmon did not see its cause (garbage
collection, the machine's load, a longer sequence).

Example:
    >>> times, counts, slow = fit_time(run.steps, run.phases, run.shapes, floor_s=0.0003, compiles=run.compiles)
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
RECOMPILE_MIN_S = 0.01  # a compile that cost less is not named (a trace that reused a program)
LISTED = 20  # slow steps listed one by one, longest excess first
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
_KIND = {kind: k for k, kind in enumerate(schema.PHASE_KINDS)}
_SAME_S = 1e-4  # a shape record names the step that begins within this of its time (steps are stored to the µs)


def fit_time(steps: np.ndarray, phases: np.ndarray, shapes: list[dict[str, Any]], floor_s: float,
             compiles: list[dict[str, Any]] = ()) -> tuple[dict[str, float], dict[str, int], list[dict[str, Any]]]:
    """{"fit", every part of `PARTS`, "input_wait" (inside "steps"), "unaccounted", "training" (the fit after its
    warm-up)} in seconds; the count of slow steps by cause; and the slow steps themselves, longest excess first."""
    gap = steps[:, _S["host_gap_ms"]] / 1e3
    kept = ~np.isnan(gap)  # each fit's first step lies inside its warm-up phase
    begin, end = steps[kept, _S["begin"]], steps[kept, _S["end"]]
    batches = np.maximum(steps[kept, _S["batches"]], 1)
    duration = end - begin
    wait = np.nan_to_num(steps[kept, _S["input_wait_ms"]] / 1e3)
    phase_s = {kind: float((phases[:, 2] - phases[:, 1])[phases[:, 0] == k].sum()) for kind, k in _KIND.items()}
    compiled = record_at(begin, compiles)
    excess, cause = _slow(duration, batches, pipeline_wait_s(wait, batches, floor_s), compiled, compiles)
    recompiles, slow = float(excess[cause == "recompile"].sum()), float(excess[cause == "unknown"].sum())
    times = {"fit": _fit_spans_s(steps, phases), "warmup": phase_s["warmup"],
             "steps": float(duration.sum()) - recompiles - slow, "recompiles": recompiles, "slow_steps": slow,
             "host_gaps": float(gap[kept].sum()), "validation": phase_s["eval"], "epoch_ends": phase_s["epoch_end"],
             "profiling": phase_s["profile"], "input_wait": float(wait.sum())}
    times["unaccounted"] = times["fit"] - sum(times[part] for part in PARTS)
    times["training"] = times["fit"] - times["warmup"]
    counts = {name: int((cause == name).sum()) for name in ("recompile", "input", "unknown")}
    return ({name: round(seconds, 4) for name, seconds in times.items()}, counts,
            _listed(steps[kept], duration, excess, cause, compiled, compiles, shapes))


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


def record_at(begin: np.ndarray, records: list[dict[str, Any]]) -> np.ndarray:
    """Per step: the index into `records` (shape or compile records) of the one made at its begin, else -1."""
    found = np.full(len(begin), -1)
    if not len(begin):
        return found
    order = np.argsort(begin, kind="stable")
    for index, record in enumerate(records):
        at = int(np.searchsorted(begin[order], record["time"]))
        near = [i for i in (at - 1, at) if 0 <= i < len(order)]
        best = min(near, key=lambda i: abs(begin[order[i]] - record["time"]))
        if abs(begin[order[best]] - record["time"]) <= _SAME_S:
            found[order[best]] = index
    return found


def _slow(duration: np.ndarray, batches: np.ndarray, wait_beyond_s: np.ndarray, compiled: np.ndarray,
          compiles: list[dict[str, Any]], median_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each step's time beyond a normal step of its batches (`median_s` per batch, or the median of these steps
    that compiled nothing), and its cause: "recompile", "input", "unknown", or "" for a step that is not slow.
    `compiled`: per step, the index of its compile record (`record_at`) or -1."""
    cause = np.full(len(duration), "", dtype=object)
    if not len(duration):
        return np.zeros(0), cause
    if median_s is None:
        plain = compiled < 0
        median_s = float(np.median((duration / batches)[plain if plain.any() else slice(None)]))
    expected = median_s * batches
    excess = duration - expected
    measured = np.array([np.nan if i < 0 or compiles[i].get("seconds") is None else compiles[i]["seconds"]
                         for i in compiled], dtype=float)
    excess = np.where(np.isnan(measured), excess, np.minimum(measured, duration))
    recompiled = (compiled >= 0) & (excess >= RECOMPILE_MIN_S)
    slow = (compiled < 0) & (duration >= SLOW_FACTOR * expected) & (excess >= SLOW_MIN_S)
    cause[recompiled] = "recompile"
    cause[slow & (wait_beyond_s >= 0.5 * excess)] = "input"
    cause[slow & (wait_beyond_s < 0.5 * excess)] = "unknown"
    return excess, cause


def _listed(rows: np.ndarray, duration: np.ndarray, excess: np.ndarray, cause: np.ndarray, compiled: np.ndarray,
            compiles: list[dict[str, Any]], shapes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The slow steps, longest excess first (at most `LISTED`); recompiles with their shapes and the ones before."""
    records = sorted(shapes, key=lambda record: record["time"])
    listed = []
    for i in sorted(np.flatnonzero(cause != ""), key=lambda i: -excess[i])[:LISTED]:
        item = {"step": int(rows[i, _S["step"]]), "epoch": int(rows[i, _S["epoch"]]),
                "duration_s": round(float(duration[i]), 4), "excess_s": round(float(excess[i]), 4),
                "cause": str(cause[i])}
        if cause[i] == "recompile":
            record = compiles[compiled[i]]
            before = [r for r in records if r["time"] < record["time"] - _SAME_S]
            item.update(shapes=record.get("shapes"), previous_shapes=before[-1]["shapes"] if before else None,
                        compiled_by=record.get("source"))
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
