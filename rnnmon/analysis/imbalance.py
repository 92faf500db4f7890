"""`DEVICE_IMBALANCE`: one GPU of a process idles far more than the others (`MirroredStrategy`, `DataParallel`).

The replicas of synchronous data-parallel training meet at every all-reduce, so the GPU that idles most is the
one that waits: the others (or one of them) are slower or have more work. The finding names the idle GPU, the
numbers of every GPU, and how much of its idle time rnnmon blamed on waiting for the others (cause "sync").
That wait is what balancing the GPUs can remove: `speedup` is the Amdahl bound of its share of step time.

Example:
    >>> [f.code for f in device_imbalance(summarize(run))]     # rnnmon.analysis.summary calls this
    ['DEVICE_IMBALANCE']
"""

from __future__ import annotations

from typing import Any

from rnnmon.findings import Finding, amdahl

IDLE_SPREAD = 0.20  # idle share of samples above the other GPUs' mean
UTIL_SPREAD_PCT = 20.0  # mean utilization below the other GPUs' mean, in points


def device_imbalance(summary: dict[str, Any]) -> list[Finding]:
    """A finding for the GPU whose idle share or utilization is far from the other GPUs', if any."""
    gpus = [g for g in summary["gpus"] if g["util_mean"] is not None and g["idle_fraction"] is not None]
    if len(gpus) < 2 or summary["verdict"] == "insufficient-data":
        return []

    def spread(gpu: dict[str, Any]) -> tuple[float, float]:
        others = [g for g in gpus if g is not gpu]
        idle = gpu["idle_fraction"] - sum(g["idle_fraction"] for g in others) / len(others)
        util = sum(g["util_mean"] for g in others) / len(others) - gpu["util_mean"]
        return idle, util

    worst = max(gpus, key=lambda g: spread(g)[0] + spread(g)[1] / 100)
    idle, util = spread(worst)
    if idle < IDLE_SPREAD and util < UTIL_SPREAD_PCT:
        return []
    others = [g for g in gpus if g is not worst]
    sync_s = worst.get("idle_by_cause_s", {}).get("sync", 0.0)
    numbers = ", ".join(f"GPU {g['index']} idle {_pct(g['idle_fraction'])} (utilization {g['util_mean']:.0f}%)"
                        for g in gpus)
    busier = ", ".join(f"GPU {g['index']}" for g in others)
    step_s = summary["wall_s"] * (1 - (summary["eval_fraction"] or 0) - (summary["epoch_end_fraction"] or 0))
    speedup = amdahl(sync_s / step_s) if sync_s > 0 and step_s > 0 else None
    bound = (f"Balancing them: up to {speedup:.2f}x shorter steps (that wait is {_pct(sync_s / step_s)} of step "
             "time)." if speedup else "None of it fell while another GPU computed, so balancing promises no "
             "speed-up: check that the model computes on it.")
    message = (f"GPU {worst['index']} idles {100 * idle:.0f} points more than the other GPUs: {numbers}. "
               f"Replicas meet at every all-reduce, so GPU {worst['index']} waits for {busier}: "
               f"{sync_s:.1f} s of its idle time fell while another GPU computed (cause sync). {bound}")
    one = len(others) == 1
    advice = (f"Find out why {busier} {'takes' if one else 'take'} longer per step: another process on "
              f"{'it' if one else 'them'} (`nvidia-smi`), throttling "
              "(clocks, temperature, power), a slower link (`nvidia-smi topo -m`), or an uneven split (make the "
              "global batch divisible by the number of replicas). If a GPU is not one the model trains on, "
              "pass `devices=[...]` so rnnmon watches only those.")
    return [Finding.of("DEVICE_IMBALANCE", f"GPU {worst['index']}", message, advice, speedup)]


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"
