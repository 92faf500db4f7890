"""Workers of one multi-worker job side by side, and `STRAGGLER`: the worker that holds the others back.

A worker's run is `<job>/worker-<index>/rnnmon` (see rnnmon.capture.workers). In synchronous training every worker
waits for the slowest at each all-reduce, so all of them end up with about the same step time; the straggler
is the one whose own stall per step (input wait + host gap) is far above the others', or, with no such stall,
whose GPU idles far less than theirs (it computes longer per step). The difference is how long every step of
the other workers waits for it; `speedup` is the Amdahl bound of removing it from the job's step.

Example:
    >>> groups = compare_workers([summarize(run) for run in runs.values()])
    >>> groups[0]["findings"][0]["where"]
    'worker-1'
"""

from __future__ import annotations

import statistics
from typing import Any

from rnnmon.findings import Finding, amdahl
from rnnmon.format import schema

MIN_EXCESS_MS = 1.0  # a stall difference below this is noise
EXCESS_SHARE = 0.20  # ... and so is one below this share of the others' median step
IDLE_SPREAD = 0.20  # GPU idle share below the others' by this much: a compute straggler

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


def compare_workers(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per job with two or more worker runs: each worker's numbers and the STRAGGLER finding, if any."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for summary in summaries:
        found = worker_of(summary["run"])
        if found is not None and summary["verdict"] != "insufficient-data":
            jobs.setdefault(found[0], []).append(_row(found[1], summary))
    groups = []
    for job, rows in sorted(jobs.items()):
        if len(rows) >= 2:
            rows.sort(key=lambda row: worker_order(row["worker"]))
            groups.append({"job": job, "workers": rows, "findings": [f.to_dict() for f in _straggler(rows)]})
    return groups


def _row(worker: str, summary: dict[str, Any]) -> dict[str, Any]:
    steps = max(summary["steps"], 1)
    wait = summary["input_wait_ms"]
    idle = [g["idle_fraction"] for g in summary["gpus"] if g["idle_fraction"] is not None]
    host_gap_ms = 1e3 * (summary["host_gap_fraction"] or 0.0) * summary["wall_s"] / steps
    return {"worker": worker, "run": summary["run"], "step_ms": summary["step_ms"]["median"],
            "input_wait_ms": None if wait is None else wait["median"], "host_gap_ms": round(host_gap_ms, 3),
            "host_gap_fraction": summary["host_gap_fraction"],
            "gpu_idle_fraction": round(sum(idle) / len(idle), 4) if idle else None}


def _straggler(rows: list[dict[str, Any]]) -> list[Finding]:
    def stall(row: dict[str, Any]) -> float:
        return (row["input_wait_ms"] or 0.0) + row["host_gap_ms"]

    worst = max(rows, key=stall)
    others = [row for row in rows if row is not worst]
    step = statistics.median(row["step_ms"] for row in others)
    excess = stall(worst) - statistics.median(stall(row) for row in others)
    if excess >= max(MIN_EXCESS_MS, EXCESS_SHARE * step):
        wait_excess = (worst["input_wait_ms"] or 0.0) - statistics.median(row["input_wait_ms"] or 0.0
                                                                           for row in others)
        cause = "input wait" if wait_excess >= excess / 2 else "host gap"
        mine = worst["input_wait_ms"] if cause == "input wait" else worst["host_gap_ms"]
        theirs = statistics.median((row["input_wait_ms"] if cause == "input wait" else row["host_gap_ms"]) or 0.0
                                   for row in others)
        measured = (f"{worst['worker']} spends a median {mine:.2f} ms of each step on {cause} against "
                    f"{theirs:.2f} ms on the other workers")
    else:
        idle = [row for row in rows if row["gpu_idle_fraction"] is not None]
        if len(idle) < 2:
            return []
        worst = min(idle, key=lambda row: row["gpu_idle_fraction"])
        others = [row for row in idle if row is not worst]
        spread = statistics.median(row["gpu_idle_fraction"] for row in others) - worst["gpu_idle_fraction"]
        if spread < IDLE_SPREAD:
            return []
        cause = "compute"
        step = statistics.median(row["step_ms"] for row in others)
        excess = spread * step
        measured = (f"{worst['worker']}'s GPU idles {100 * worst['gpu_idle_fraction']:.0f}% of the time against "
                    f"{100 * (worst['gpu_idle_fraction'] + spread):.0f}% on the other workers: it computes longer")
    speedup = amdahl(excess / step)
    message = (f"{measured}. Synchronous training waits for the slowest worker at every step, so it holds the "
               f"others back by about {excess:.1f} ms a step ({100 * excess / step:.0f}% of their median "
               f"{step:.2f} ms step). Cause: {cause}. Bringing it level with the others: up to {speedup:.2f}x "
               "shorter steps for the job.")
    return [Finding.of("STRAGGLER", worst["worker"], message, _ADVICE[cause], speedup)]
