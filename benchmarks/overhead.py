"""What UtilizationMonitor costs a training step: interleaved fits with and without it, in one process.

A tiny LSTM (16 units, 16x8 inputs, batch 32) trains on an in-memory, prefetched tf.data pipeline for
`--steps` steps per fit, always the same model. Fits with and without the monitor alternate (AB, BA), and the
fake NVML library is installed so the sampler thread really polls. Each fit gives two numbers: the
steady-state time per step (5th execution to last, stamped by a callback both arms carry) and the whole fit's
time, which adds the monitor's setup and teardown. Medians over the paired fits give ratios and costs.

Configurations: steps_per_execution=1 with input wait timed (the default), the same without input timing
(hooks, sampler and writer alone), and steps_per_execution=8 without (the default) and with input timing.

Usage:
    python benchmarks/overhead.py [--repeats 25] [--steps 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import keras
from conftest import BATCH, sequences, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed


class StepClock(keras.callbacks.Callback):
    """Stamps the end of every execution, so steady-state step time excludes each fit's setup and teardown."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.stamps.append(time.perf_counter())

    def steady_s_per_execution(self, skip: int = 5) -> float:
        return (self.stamps[-1] - self.stamps[skip]) / (len(self.stamps) - 1 - skip)


def measure(steps: int, repeats: int, steps_per_execution: int, measure_input_wait: bool | None) -> dict:
    import tensorflow as tf

    from rnnmon import UtilizationMonitor

    x, y = sequences(steps)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(2)
    model = tiny_model(steps_per_execution=steps_per_execution)  # one model: both arms run the same function
    logdir = tempfile.mkdtemp(prefix="rnnmon-bench-")
    fits: dict[str, list[float]] = {"plain": [], "rnnmon": []}
    steady: dict[str, list[float]] = {"plain": [], "rnnmon": []}

    def fit(arm: str) -> None:
        clock = StepClock()
        callbacks: list[keras.callbacks.Callback] = [clock]
        if arm == "rnnmon":  # rnnmon first, as a user's callback list would have it
            callbacks.insert(0, UtilizationMonitor(logdir, measure_input_wait=measure_input_wait))
        start = time.perf_counter()
        model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)
        fits[arm].append(time.perf_counter() - start)
        steady[arm].append(clock.steady_s_per_execution() / steps_per_execution)

    for arm in fits:  # trace before timing
        fit(arm)
        fits[arm].clear()
        steady[arm].clear()
    for repeat in range(repeats):
        for arm in ("plain", "rnnmon") if repeat % 2 == 0 else ("rnnmon", "plain"):
            fit(arm)
    timed = steps_per_execution == 1 if measure_input_wait is None else measure_input_wait
    return {
        "steps_per_execution": steps_per_execution, "input_wait_timed": timed, "steps": steps, "repeats": repeats,
        "step_ms_plain": round(1e3 * statistics.median(steady["plain"]), 3),
        "steady_ratio": _median_ratio(steady),
        "cost_per_step_us": round(1e6 * statistics.median(w - p for p, w in zip(*steady.values())), 1),
        "fit_ratio": _median_ratio(fits),
        "cost_per_fit_ms": round(1e3 * statistics.median(w - p for p, w in zip(*fits.values())), 1),
    }


def _median_ratio(times: dict[str, list[float]]) -> float:
    return round(statistics.median(w / p for p, w in zip(times["plain"], times["rnnmon"])), 4)


def hook_cost_us(calls: int = 50_000) -> float:
    """The monitor's own per-step bookkeeping (batch-begin and batch-end hooks), timed without training."""
    from rnnmon import UtilizationMonitor

    monitor = UtilizationMonitor(tempfile.mkdtemp(prefix="rnnmon-bench-"), measure_input_wait=False, audit=False)
    monitor.set_model(tiny_model())
    monitor.on_train_begin()
    monitor.on_epoch_begin(0)
    start = time.perf_counter()
    for batch in range(calls):
        monitor.on_train_batch_begin(batch)
        monitor.on_train_batch_end(batch, {"loss": 0.0})
    elapsed = time.perf_counter() - start
    monitor.on_train_end()
    return round(1e6 * elapsed / calls, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with installed(FakeNvmlLib([FakeGpu(pids=[os.getpid()])])):
        results = [measure(args.steps, args.repeats, 1, None),  # the default: input wait timed
                   measure(args.steps, args.repeats, 1, False),  # hooks, sampler and writer alone
                   measure(args.steps, args.repeats, 8, None),  # the default at spe=8: not timed
                   measure(args.steps, args.repeats, 8, True)]
        hooks = hook_cost_us()
    if args.json:
        print(json.dumps({"fits": results, "hook_cost_us": hooks}, indent=2))
        return
    print(f"{'spe':>4} {'input wait':>10} {'plain step':>11} {'step ratio':>11} {'cost/step':>10} "
          f"{'fit ratio':>10} {'cost/fit':>9}")
    for r in results:
        wait = "timed" if r["input_wait_timed"] else "not timed"
        print(f"{r['steps_per_execution']:>4} {wait:>10} {r['step_ms_plain']:>8.3f} ms {r['steady_ratio']:>11.3f} "
              f"{r['cost_per_step_us']:>7.1f} us {r['fit_ratio']:>10.3f} {r['cost_per_fit_ms']:>6.1f} ms")
    print(f"hooks alone (batch begin + end, no training): {hooks:.2f} us per step")


if __name__ == "__main__":
    main()
