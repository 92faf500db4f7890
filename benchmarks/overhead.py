"""What UtilizationMonitor costs a fit, beside Keras's own `TensorBoard(update_freq="batch")`, in one process.

A tiny LSTM (16 units, 16x8 inputs, batch 32) trains on an in-memory, prefetched tf.data pipeline for `--steps`
steps per fit. Three arms alternate in a rotating order (plain fit, rnnmon, Keras's TensorBoard callback writing
every batch), with the fake NVML library installed so rnnmon's sampler thread really polls. Each fit gives:
- the steady step: median wall time between batch ends (5th execution to last), and the worst step;
- the whole fit's wall time, which adds each callback's setup and teardown;
- the CPU time of the training thread per step (`time.thread_time` between batch ends): on TensorFlow the ops run
  on TensorFlow's own pool, so this is the Python work of a step, where rnnmon's hooks and input-wait wrapper run;
- the CPU time of rnnmon's background threads (`rnnmon-*`) per second of training, from each thread's CPU clock.
Ratios and costs are medians over the fits, paired with the plain fit of the same round.

Finally it checks that a fit leaves no reference cycles holding iterators, frames, tracebacks or exceptions
(`gc.collect()` after the fit, with `gc.DEBUG_SAVEALL`): walking such cycles made a gen-1 collection take seconds.

Only TensorFlow, Keras, numpy, pynvml and rnnmon are needed (no pytest); the fake NVML library comes from this
checkout's tests/fake_nvml.py, and without it the sampler runs without a GPU.

Usage:
    python benchmarks/overhead.py [--repeats 15] [--steps 300] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np

TIMESTEPS, FEATURES, BATCH, SKIP = 16, 8, 32, 5
ARMS = ("plain", "rnnmon", "keras_tensorboard")


def tiny_model(steps_per_execution: int = 1) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((TIMESTEPS, FEATURES)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    return model


def dataset(batches: int) -> Any:
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(batches * BATCH, TIMESTEPS, FEATURES)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :, :1].mean(axis=1))).batch(BATCH).prefetch(2)


def background_cpu_s() -> float:
    """CPU seconds used so far by rnnmon's live background threads."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("rnnmon") and thread.ident is not None:
            with contextlib.suppress(OSError, ProcessLookupError):
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


class StepClock(keras.callbacks.Callback):
    """Stamps every batch end: wall time, the training thread's CPU time, rnnmon's background CPU time."""

    def __init__(self) -> None:
        super().__init__()
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.background: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.wall.append(time.perf_counter())
        self.cpu.append(time.thread_time())
        self.background.append(background_cpu_s())

    def figures(self, steps_per_execution: int) -> dict[str, float]:
        wall = np.diff(self.wall[SKIP:]) / steps_per_execution
        cpu = np.diff(self.cpu[SKIP:]) / steps_per_execution
        trained_s = self.wall[-1] - self.wall[SKIP]
        return {"step_s": float(np.median(wall)), "worst_step_s": float(wall.max()),
                "p99_step_s": float(np.percentile(wall, 99)), "cpu_per_step_s": float(np.median(cpu)),
                "background_cpu_per_s": (self.background[-1] - self.background[SKIP]) / trained_s}


def callbacks_for(arm: str, logdir: str) -> list[keras.callbacks.Callback]:
    if arm == "rnnmon":
        from rnnmon import UtilizationMonitor

        return [UtilizationMonitor(os.path.join(logdir, "rnnmon"))]
    if arm == "keras_tensorboard":
        return [keras.callbacks.TensorBoard(os.path.join(logdir, "keras"), update_freq="batch")]
    return []


def measure(steps: int, repeats: int, steps_per_execution: int) -> dict[str, Any]:
    data = dataset(steps)
    model = tiny_model(steps_per_execution)  # one model: every arm runs the same compiled function
    logdir = tempfile.mkdtemp(prefix="rnnmon-bench-")
    fits: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}

    def fit(arm: str) -> dict[str, float]:
        clock = StepClock()
        start = time.perf_counter()
        model.fit(data, epochs=1, verbose=0, callbacks=[*callbacks_for(arm, logdir), clock])
        return {"fit_s": time.perf_counter() - start, **clock.figures(steps_per_execution)}

    for arm in ARMS:  # trace and warm up before timing
        fit(arm)
    for repeat in range(repeats):
        order = ARMS[repeat % 3:] + ARMS[:repeat % 3]
        for arm in order:
            fits[arm].append(fit(arm))
    result: dict[str, Any] = {"steps_per_execution": steps_per_execution, "steps": steps, "repeats": repeats,
                              "step_ms_plain": _ms(_median(fits["plain"], "step_s"))}
    for arm in ARMS[1:]:
        result[arm] = {
            "steady_ratio": _paired_ratio(fits, arm, "step_s"),
            "fit_ratio": _paired_ratio(fits, arm, "fit_s"),
            "cost_per_fit_ms": _ms(statistics.median(
                b["fit_s"] - a["fit_s"] for a, b in zip(fits["plain"], fits[arm]))),
            "thread_cpu_per_step_us": round(1e6 * _median(fits[arm], "cpu_per_step_s"), 1),
            "added_thread_cpu_per_step_us": round(1e6 * statistics.median(
                b["cpu_per_step_s"] - a["cpu_per_step_s"] for a, b in zip(fits["plain"], fits[arm])), 1),
            "worst_step_ms": _ms(_median(fits[arm], "worst_step_s")),
            "p99_step_ms": _ms(_median(fits[arm], "p99_step_s")),
            "background_cpu_pct": round(100 * _median(fits[arm], "background_cpu_per_s"), 3),
        }
    result["plain"] = {"thread_cpu_per_step_us": round(1e6 * _median(fits["plain"], "cpu_per_step_s"), 1),
                       "worst_step_ms": _ms(_median(fits["plain"], "worst_step_s")),
                       "p99_step_ms": _ms(_median(fits["plain"], "p99_step_s"))}
    return result


def hook_cost_us(calls: int = 50_000) -> float:
    """The monitor's own per-step bookkeeping (batch-begin and batch-end hooks), timed without training."""
    from rnnmon import UtilizationMonitor

    monitor = UtilizationMonitor(tempfile.mkdtemp(prefix="rnnmon-bench-"), measure_input_wait=False, audit=False)
    monitor.set_model(tiny_model())
    monitor.on_train_begin()
    monitor.on_epoch_begin(0)
    start = time.thread_time()
    for batch in range(calls):
        monitor.on_train_batch_begin(batch)
        monitor.on_train_batch_end(batch, {"loss": 0.0})
    elapsed = time.thread_time() - start
    monitor.on_train_end()
    return round(1e6 * elapsed / calls, 2)


CYCLE_TYPES = (types.FrameType, types.TracebackType, types.GeneratorType, BaseException)


def cycles_after_fit(arm: str, steps: int = 40) -> dict[str, Any]:
    """Objects that only the cycle collector frees after one fit, and those among them that hold frames."""
    model, data = tiny_model(), dataset(steps)
    model.fit(data, epochs=1, verbose=0, callbacks=callbacks_for(arm, tempfile.mkdtemp(prefix="rnnmon-bench-")))
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        model.fit(data, epochs=2, verbose=0, callbacks=callbacks_for(arm, tempfile.mkdtemp(prefix="rnnmon-bench-")))
        start = time.perf_counter()
        found = gc.collect()
        collect_s = time.perf_counter() - start
        held = sorted({type(o).__name__ for o in gc.garbage if isinstance(o, CYCLE_TYPES) or _is_iterator(o)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return {"arm": arm, "cyclic_objects": found, "frames_tracebacks_iterators": held,
            "collect_ms": round(1e3 * collect_s, 1)}


def _is_iterator(obj: Any) -> bool:
    return "iterator" in type(obj).__name__.lower() or type(obj).__name__ in ("generator", "OwnedIterator")


@contextlib.contextmanager
def fake_gpu() -> Iterator[bool]:
    """The fake NVML library from this checkout's tests/, when it is there; else no GPU."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    try:
        from fake_nvml import FakeGpu, FakeNvmlLib, installed
    except ImportError:
        yield False
        return
    with installed(FakeNvmlLib([FakeGpu(pids=[os.getpid()])])):
        yield True


def _median(fits: list[dict[str, float]], key: str) -> float:
    return statistics.median(f[key] for f in fits)


def _paired_ratio(fits: dict[str, list[dict[str, float]]], arm: str, key: str) -> float:
    return round(statistics.median(b[key] / a[key] for a, b in zip(fits["plain"], fits[arm])), 4)


def _ms(seconds: float) -> float:
    return round(1e3 * seconds, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with fake_gpu() as gpu:
        results = [measure(args.steps, args.repeats, 1), measure(args.steps, args.repeats, 8)]
        hooks = hook_cost_us()
        cycles = [cycles_after_fit(arm) for arm in ("plain", "rnnmon")]
    report = {"fake_gpu": gpu, "fits": results, "hook_cost_us": hooks, "cycles": cycles}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"fake GPU: {gpu}; {args.repeats} rounds of {args.steps}-step fits, arms in rotating order")
    print(f"{'spe':>3} {'arm':<18} {'step ratio':>10} {'fit ratio':>9} {'cost/fit':>9} {'thread CPU/step':>16} "
          f"{'added':>9} {'worst step':>11} {'p99 step':>9} {'background':>10}")
    for r in results:
        plain = r["plain"]
        print(f"{r['steps_per_execution']:>3} {'plain':<18} {r['step_ms_plain']:>7.3f} ms {'':>9} {'':>9} "
              f"{plain['thread_cpu_per_step_us']:>13.1f} us {'':>9} {plain['worst_step_ms']:>8.2f} ms "
              f"{plain['p99_step_ms']:>6.2f} ms")
        for arm in ARMS[1:]:
            a = r[arm]
            print(f"{r['steps_per_execution']:>3} {arm:<18} {a['steady_ratio']:>10.3f} {a['fit_ratio']:>9.3f} "
                  f"{a['cost_per_fit_ms']:>6.1f} ms {a['thread_cpu_per_step_us']:>13.1f} us "
                  f"{a['added_thread_cpu_per_step_us']:>6.1f} us {a['worst_step_ms']:>8.2f} ms "
                  f"{a['p99_step_ms']:>6.2f} ms "
                  f"{a['background_cpu_pct']:>8.3f} %")
    print(f"hooks alone (batch begin + end, no training): {hooks:.2f} us of CPU per step")
    for c in cycles:
        print(f"cycles after a fit ({c['arm']}): {c['cyclic_objects']} objects, {c['collect_ms']} ms to collect; "
              f"frames/tracebacks/iterators among them: {c['frames_tracebacks_iterators'] or 'none'}")


if __name__ == "__main__":
    main()
