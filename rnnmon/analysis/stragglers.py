"""Workers of one multi-worker job side by side, and `STRAGGLER`: the worker that holds the others back.

A worker's run is `<job>/worker-<index>/rnnmon` (see rnnmon.capture.workers). In synchronous training every worker
waits for the slowest at each all-reduce, so all of them end up with about the same step time, the job's step. What
the whole job waits for one worker each step is measured as:
- its stall beyond the others': its median input wait plus host gap, less the other workers' median of the same;
- plus, with GPU data, its extra compute: its GPU idles less than theirs (they idle while waiting for it), by that
  share of the job's step.
`STRAGGLER` fires when that time reaches `EXCESS_SHARE` (5%) of the job's step (the other workers' median step;
at least `MIN_EXCESS_MS`). It is compared with the job's step, not with the others' step less their wait: the
others' step already holds their wait for the straggler, so the worse it is, the larger the job's step, and the
share is what removing it saves. `speedup` is the Amdahl bound of removing it from the job's step.

Each worker is compared by its `worker_figures` (rnnmon.analysis.worker_figures): `summarize`'s figures, without
the rest of a summary.

Example:
    >>> groups = compare_workers([worker_figures(run) for run in runs.values()])
    >>> groups[0]["findings"][0]["where"]
    'worker-1'
"""

from __future__ import annotations

import bisect
import statistics
from typing import Any

from rnnmon.findings import Finding, amdahl
from rnnmon.format import schema

MIN_EXCESS_MS = 1.0  # a wait below this is noise
EXCESS_SHARE = 0.05  # the job waits this share of its step for one worker: a straggler
IDLE_NOISE = 0.05  # GPU idle shares closer than this are not told apart (sampling, gaps below min_gap_ms)

_ADVICE = {
    "input wait": ("Speed up this worker's input pipeline: check its data source (a slower disk or network "
                   "share), its CPU load, and that every worker reads a shard of the same size; then add "
                   "`.prefetch(tf.data.AUTOTUNE)` and `num_parallel_calls=tf.data.AUTOTUNE`."),
    "host gap": ("Look for Python work between steps on this worker only: a callback, logging or checkpointing "
                 "that runs on the chief, or a busy host CPU."),
    "compute": ("This worker's GPU computes longer per step: check it for another process, throttling, a "
                "slower model of GPU, or a larger share of the data."),
}


def worker_of(run: str) -> tuple[str, str] | None:
    """(job, worker) for a run named `[job/]worker-<index>/rnnmon`, else None."""
    parts = run.split("/")
    if len(parts) >= 2 and schema.WORKER_DIR.fullmatch(parts[-2]):
        return "/".join(parts[:-2]) or ".", parts[-2]
    return None


def worker_order(worker: str) -> tuple[str, int]:
    """Sort key of a worker's folder name: by task type, then by index (`worker-2` before `worker-10`)."""
    kind, index = worker.rsplit("-", 1)
    return kind, int(index)


def compare_workers(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per job with two or more worker runs that have a verdict: each worker's numbers and the STRAGGLER finding, if
    any, from each run's `worker_figures`."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for run in figures:
        found = worker_of(run["run"])
        if found is not None and run["judged"]:
            jobs.setdefault(found[0], []).append(_row(found[1], run))
    groups = []
    for job, rows in sorted(jobs.items()):
        if len(rows) >= 2:
            rows.sort(key=lambda row: worker_order(row["worker"]))
            groups.append({"job": job, "workers": rows, "findings": [f.to_dict() for f in _straggler(rows)]})
    return groups


def _row(worker: str, figures: dict[str, Any]) -> dict[str, Any]:
    steps = max(figures["steps"], 1)
    idle = [share for share in figures["gpu_idle_fractions"] if share is not None]
    host_gap_ms = 1e3 * (figures["host_gap_fraction"] or 0.0) * figures["wall_s"] / steps
    return {"worker": worker, "run": figures["run"], "step_ms": figures["step_ms"],
            "input_wait_ms": figures["input_wait_ms"], "host_gap_ms": round(host_gap_ms, 3),
            "host_gap_fraction": figures["host_gap_fraction"],
            "gpu_idle_fraction": round(sum(idle) / len(idle), 4) if idle else None}


def _stall(row: dict[str, Any]) -> float:
    return (row["input_wait_ms"] or 0.0) + row["host_gap_ms"]


def _waits(worst: dict[str, Any], others: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(the job's step, `worst`'s stall beyond the others', its extra compute) in ms a step, as measured."""
    idle = [row["gpu_idle_fraction"] for row in others if row["gpu_idle_fraction"] is not None]
    return _beyond(worst, statistics.median(row["step_ms"] for row in others),
                   statistics.median(_stall(row) for row in others), statistics.median(idle) if idle else None)


def _beyond(worst: dict[str, Any], step: float, stall: float, idle: float | None) -> tuple[float, float, float]:
    """`_waits` from the other workers' median step, stall and GPU idle share (None: no GPU data)."""
    spread = idle - worst["gpu_idle_fraction"] if idle is not None and worst["gpu_idle_fraction"] is not None else 0.0
    return step, max(_stall(worst) - stall, 0.0), spread * step if spread >= IDLE_NOISE else 0.0


def _medians_of_others(values: list[float | None]) -> list[float | None]:
    """For each entry, `statistics.median` of the other entries that are not None (None where there are none):
    one sort for all, where a median per entry sorted the rest again (2,000 workers: 4 million calls, 5 s)."""
    pool = sorted(value for value in values if value is not None)
    return [_median_without(pool, len(pool) if value is None else bisect.bisect_left(pool, value))
            for value in values]


def _median_without(pool: list[float], skip: int) -> float | None:
    """The median of the sorted `pool` without its entry at `skip` (none left out at len(pool))."""
    count = len(pool) - (skip < len(pool))
    if not count:
        return None
    half = count // 2
    lower, upper = (pool[j if j < skip else j + 1] for j in (half - 1 + count % 2, half))
    return upper if count % 2 else (lower + upper) / 2


def _straggler(rows: list[dict[str, Any]]) -> list[Finding]:
    steps = _medians_of_others([row["step_ms"] for row in rows])
    stalls = _medians_of_others([_stall(row) for row in rows])
    idles = _medians_of_others([row["gpu_idle_fraction"] for row in rows])
    waited = [sum(_beyond(row, step, stall, idle)[1:]) for row, step, stall, idle in zip(rows, steps, stalls, idles)]
    worst = rows[max(range(len(rows)), key=waited.__getitem__)]  # the first of equals, as max(rows) gave
    others = [row for row in rows if row is not worst]
    step, stall, compute = _waits(worst, others)
    total = stall + compute
    if total < max(MIN_EXCESS_MS, EXCESS_SHARE * step):
        return []
    parts, cause = [], "compute"
    if stall > 0:
        wait_excess = (worst["input_wait_ms"] or 0.0) - statistics.median(row["input_wait_ms"] or 0.0
                                                                          for row in others)
        kind = "input wait" if wait_excess >= stall / 2 else "host gap"
        key = "input_wait_ms" if kind == "input wait" else "host_gap_ms"
        theirs = statistics.median(row[key] or 0.0 for row in others)
        cause = kind if stall >= compute else cause
        parts.append(f"{worst['worker']} spends a median {worst[key] or 0.0:.2f} ms of each step on {kind} against "
                     f"{theirs:.2f} ms on the other workers")
    if compute > 0:
        theirs = statistics.median(row["gpu_idle_fraction"] for row in others
                                   if row["gpu_idle_fraction"] is not None)
        parts.append(f"{worst['worker']}'s GPU idles {100 * worst['gpu_idle_fraction']:.0f}% of the time against "
                     f"{100 * theirs:.0f}% on the other workers: it computes {compute:.2f} ms a step longer")
    speedup = amdahl(total / step)
    beyond = (f", of which {compute:.2f} ms is its longer compute, beyond its stall"
              if stall > 0 and compute > 0 else "")
    message = (f"{'; '.join(parts)}. Synchronous training waits for the slowest worker at every step, so the whole "
               f"job waits at least {total:.2f} ms a step for it{beyond}: {100 * total / step:.0f}% of the job's "
               f"median {step:.2f} ms step. Cause: {cause}. Bringing it level with the others: up to "
               f"{speedup:.2f}x shorter steps for the job.")
    return [Finding.of("STRAGGLER", worst["worker"], message, _ADVICE[cause], speedup)]
