"""What the comparison of a multi-worker job's workers (rnnmon.analysis.stragglers) takes from each worker's run:
its steps, wall time, median step and input wait, host gap share, GPU idle shares, and whether it has a verdict.

These are `summarize`'s figures of the same names, from the same sources (the run's digest where it was read from
its index, else its tables: whole up to `digest.CAP` rows, their digest past it), without the rest of a summary:
the TensorBoard tab's `/workers` computes them for every worker of a job (2,000 workers: 0.3 ms a worker, where a
summary cost 4-7 ms), and `rnnmon report` compares workers with them too, so the two never differ.

Only the step table, the phases, the GPU utilization samples and the run description are read
(`READ_TAGS`, `READ_TAG_PREFIXES`): a reader may skip the rest.

Example:
    >>> figures = worker_figures(runs["job/worker-1/rnnmon"])
    >>> figures["step_ms"], figures["judged"]
    (20.03, True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnmon.analysis.digest_figures import (
    _hist_percentiles,
    _percentiles,
    _round,
    _timed,
    device_figures,
    idle_fraction,
)
from rnnmon.analysis.verdict import judged
from rnnmon.format import schema
from rnnmon.format.digest import CAP, DeviceDigest, StepDigest
from rnnmon.format.reader import RunData

READ_TAGS = frozenset({schema.RUN_TAG, schema.STEPS_TAG, schema.PHASES_TAG})
READ_TAG_PREFIXES = (schema.UTIL_TAG_PREFIX,)
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
_WALL_PHASES = [schema.PHASE_KINDS.index(kind) for kind in ("eval", "epoch_end")]  # beside steps and host gaps


def worker_figures(run: RunData) -> dict[str, Any]:
    """{"run", "judged" (a verdict other than insufficient-data), "steps", "wall_s", "step_ms" and "input_wait_ms"
    (medians per batch; None where none was measured), "host_gap_fraction", "gpu_idle_fractions" (per GPU in index
    order; None without samples)}: what `summarize(run)` reports under those names."""
    steps = _step_source(run)
    figures = _exact(steps) if isinstance(steps, np.ndarray) else _approximate(steps)
    gap_s = figures.pop("gap_s")
    step_total = figures.pop("duration_s") + gap_s
    wall = step_total
    for kind in _WALL_PHASES:
        wall += float(np.sum((run.phases[:, 2] - run.phases[:, 1])[run.phases[:, 0] == kind]))
    return {"run": run.run, "judged": judged(figures.pop("kept"), step_total), **figures, "wall_s": round(wall, 3),
            "host_gap_fraction": _round(gap_s / wall) if wall > 0 else None,
            "gpu_idle_fractions": _idle_fractions(run)}


def _step_source(run: RunData) -> np.ndarray | StepDigest:
    """The whole step table where the summary's digest keeps it, else that digest (its figures approximate)."""
    if run.digest is None:
        if len(run.steps) <= CAP:
            return run.steps
        digest = StepDigest()
        digest.add(run.steps)
    else:
        digest = run.digest.steps
    if digest.raw is None:
        return digest
    return np.concatenate(digest.raw) if digest.raw else np.empty((0, len(schema.STEP_COLUMNS)))


def _exact(steps: np.ndarray) -> dict[str, Any]:
    """The figures from the whole step table, as `digest_figures._exact` computes them (each fit's first step,
    which traces, left out)."""
    kept = steps[~np.isnan(steps[:, _S["host_gap_ms"]])]
    batches = np.maximum(kept[:, _S["batches"]], 1)
    duration = kept[:, _S["end"]] - kept[:, _S["begin"]]
    wait = kept[:, _S["input_wait_ms"]] / 1e3
    measured = bool(len(wait)) and not np.isnan(wait).all()
    return {"steps": int(steps[:, _S["batches"]].sum()), "kept": len(duration), "duration_s": float(duration.sum()),
            "gap_s": float((kept[:, _S["host_gap_ms"]] / 1e3).sum()),
            "step_ms": _percentiles(1e3 * duration / batches)["median"],
            "input_wait_ms": _percentiles(1e3 * wait / batches)["median"] if measured else None}


def _approximate(digest: StepDigest) -> dict[str, Any]:
    """The figures from the step table's digest, as `digest_figures._approximate` computes them."""
    duration_s, gap_s, _, waited = digest.sums.tolist()
    return {"steps": int(digest.batches), "kept": digest.kept, "duration_s": duration_s, "gap_s": gap_s,
            "step_ms": _hist_percentiles(digest.step_hist[0])["median"],
            "input_wait_ms": _hist_percentiles(_timed(digest)[:, 0].sum(axis=0))["median"] if waited > 0 else None}


def _idle_fractions(run: RunData) -> list[float | None]:
    """Each GPU's idle share: from its samples while the summary's digest keeps them, else from that digest."""
    idle_pct = float(run.info.get("idle_pct", 5.0))
    if run.digest is not None:
        return [device_figures(run.digest.devices[device], idle_pct)["idle_fraction"]
                for device in sorted(run.digest.devices)]
    shares = []
    empty = np.empty((0, 0))
    for device in sorted(set(run.util) | set(run.stats)):
        util, stats = run.util.get(device, empty), run.stats.get(device, empty)
        if len(util) + len(stats) <= CAP:
            shares.append(idle_fraction(util[:, 1] if len(util) else np.empty(0), idle_pct))
            continue
        digest = DeviceDigest()
        digest.add("util", util)
        digest.add("stats", stats)
        shares.append(device_figures(digest, idle_pct)["idle_fraction"])
    return shares
