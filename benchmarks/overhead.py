"""What UtilizationMonitor costs a fit, beside Keras's own `TensorBoard(update_freq="batch")`, in one process.

A tiny LSTM (16 units, 16x8 inputs, batch 32) trains on an in-memory, prefetched tf.data pipeline for `--steps`
steps per fit. Three arms alternate in a rotating order (plain fit, rnnmon, Keras's TensorBoard callback writing
every batch), with the fake NVML library installed so rnnmon's sampler thread really polls. Each fit gives:
- the steady step: median wall time between batch ends (5th execution to last), and the worst step;
- the whole fit's wall time, which adds each callback's setup and teardown;
- the CPU time of the training thread per step (`time.thread_time`): the median and the mean between batch ends
  over the steady steps, and the whole fit's divided by its steps (setup, first steps and teardown included);
- the CPU time of the whole process per step (`time.process_time`, every thread: TensorFlow's pools, tf.data's,
  rnnmon's), over the steady steps and over the whole fit;
- the training-thread CPU a fit spends beyond its steady steps (setup, first steps, teardown), added to a plain fit;
- the CPU time of rnnmon's background threads (`rnnmon-*`) per second of training, from each thread's CPU clock.
Ratios and costs are medians over the fits, paired with the plain fit of the same round; the load average is
printed beside them.

The training thread's CPU is not only Python: TensorFlow runs some of a step's kernels on the calling thread and
some on its pool, as they fall, so on this LSTM it scatters by ±100 µs from fit to fit around ~600 µs. A
difference of medians over a few fits is then mostly that scatter. So the step's path is also timed piece by
piece on the real objects (`hot_path_us`): the batch hooks of a real fit's CallbackList with and without rnnmon,
and Keras's train function on the iterator against rnnmon's wrapper around it, `calls` times each.

Finally it checks that a fit leaves no reference cycles holding iterators, frames, tracebacks or exceptions
(`gc.collect()` after the fit, with `gc.DEBUG_SAVEALL`): walking such cycles made a gen-1 collection take seconds.

Only TensorFlow, Keras, numpy, pynvml and rnnmon are needed (no pytest); the fake NVML library comes from this
checkout's tests/fake_nvml.py, and without it the sampler runs without a GPU.

Usage:
    python benchmarks/overhead.py [--repeats 15] [--steps 300] [--spe 1 8] [--json]
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
    """Stamps every batch end: wall time, the training thread's and the process's CPU time; and every 16th, rnnmon's
    background CPU time."""

    def __init__(self) -> None:
        super().__init__()
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.process: list[float] = []
        self.background: list[tuple[int, float]] = []  # (batch end, CPU seconds) at the SKIP-th and every 16th

    def on_train_batch_end(self, batch, logs=None):
        self.wall.append(time.perf_counter())
        self.cpu.append(time.thread_time())
        self.process.append(time.process_time())
        if len(self.wall) == SKIP + 1 or len(self.wall) % 16 == 0:  # (a syscall per rnnmon thread: not every step)
            self.background.append((len(self.wall) - 1, background_cpu_s()))

    def figures(self, steps_per_execution: int) -> dict[str, float]:
        wall = np.diff(self.wall[SKIP:]) / steps_per_execution
        cpu = np.diff(self.cpu[SKIP:]) / steps_per_execution
        steps = (len(self.wall) - 1 - SKIP) * steps_per_execution
        (first, first_s), (last, last_s) = self.background[0], self.background[-1]
        return {"step_s": float(np.median(wall)), "worst_step_s": float(wall.max()),
                "p99_step_s": float(np.percentile(wall, 99)), "cpu_per_step_s": float(np.median(cpu)),
                "cpu_mean_per_step_s": (self.cpu[-1] - self.cpu[SKIP]) / steps,
                "process_cpu_per_step_s": (self.process[-1] - self.process[SKIP]) / steps,
                "background_cpu_per_s": (last_s - first_s) / max(self.wall[last] - self.wall[first], 1e-9)}


def callbacks_for(arm: str, logdir: str) -> list[keras.callbacks.Callback]:
    if arm == "rnnmon":
        from rnnmon import UtilizationMonitor

        return [UtilizationMonitor(os.path.join(logdir, "rnnmon"))]
    if arm == "keras_tensorboard":
        return [keras.callbacks.TensorBoard(os.path.join(logdir, "keras"), update_freq="batch")]
    return []


# Per-fit figures, per step: (key, label, unit scale, paired with the plain fit as an added cost)
FIGURES = (
    ("step_s", "steady step (median wall)", 1e3, "ms"),
    ("cpu_per_step_s", "training-thread CPU, steady, median", 1e6, "us"),
    ("cpu_mean_per_step_s", "training-thread CPU, steady, mean", 1e6, "us"),
    ("fit_thread_cpu_per_step_s", "training-thread CPU, whole fit / steps", 1e6, "us"),
    ("process_cpu_per_step_s", "process CPU, steady, mean", 1e6, "us"),
    ("fit_process_cpu_per_step_s", "process CPU, whole fit / steps", 1e6, "us"),
)


def measure(steps: int, repeats: int, steps_per_execution: int) -> dict[str, Any]:
    data = dataset(steps)
    model = tiny_model(steps_per_execution)  # one model: every arm runs the same compiled function
    logdir = tempfile.mkdtemp(prefix="rnnmon-bench-")
    fits: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}

    def fit(arm: str) -> dict[str, float]:
        clock = StepClock()
        callbacks = [*callbacks_for(arm, logdir), clock]
        start, thread_start, process_start = time.perf_counter(), time.thread_time(), time.process_time()
        model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
        thread_s, process_s = time.thread_time() - thread_start, time.process_time() - process_start
        figures = clock.figures(steps_per_execution)
        return {"fit_s": time.perf_counter() - start, "fit_thread_cpu_per_step_s": thread_s / steps,
                "fit_process_cpu_per_step_s": process_s / steps, **figures,
                # what the fit's training thread spent beyond `steps` steady steps: setup, first steps, teardown
                "fixed_thread_cpu_s": thread_s - steps * figures["cpu_mean_per_step_s"]}

    for arm in ARMS:  # trace and warm up before timing
        fit(arm)
    load_before = os.getloadavg()[0]
    for repeat in range(repeats):
        order = ARMS[repeat % 3:] + ARMS[:repeat % 3]
        for arm in order:
            fits[arm].append(fit(arm))
    result: dict[str, Any] = {"steps_per_execution": steps_per_execution, "steps": steps, "repeats": repeats,
                              "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    for arm in ARMS:
        figures = {key: round(scale * _median(fits[arm], key), 1) for key, _, scale, _ in FIGURES}
        figures |= {"worst_step_ms": _ms(_median(fits[arm], "worst_step_s")),
                    "p99_step_ms": _ms(_median(fits[arm], "p99_step_s")),
                    "background_cpu_pct": round(100 * _median(fits[arm], "background_cpu_per_s"), 3)}
        if arm != "plain":
            figures |= {"steady_ratio": _paired_ratio(fits, arm, "step_s"),
                        "fit_ratio": _paired_ratio(fits, arm, "fit_s"),
                        "cost_per_fit_ms": _ms(_paired_difference(fits, arm, "fit_s")),
                        "added_fixed_thread_cpu_ms": _ms(_paired_difference(fits, arm, "fixed_thread_cpu_s"))}
            figures |= {f"added_{key}": round(scale * _paired_difference(fits, arm, key), 1)
                        for key, _, scale, _ in FIGURES[1:]}
        result[arm] = figures
    return result


class HookProbe(keras.callbacks.Callback):
    """At one batch end of a real fit, times the fit's own CallbackList and its parts, `calls` times each.

    Inside the fit every wrapper rnnmon installs is in place: the hook guard on the CallbackList, the timing
    shadows on the other callbacks' batch hooks, and the monitor's own hooks. Each figure is training-thread CPU
    per step (one `on_train_batch_begin` and one `on_train_batch_end`).
    """

    def __init__(self, calls: int, at_batch: int = 20) -> None:
        super().__init__()
        self.calls, self.at_batch = calls, at_batch
        self.figures: dict[str, float] = {}
        self._probing = False

    def on_train_batch_end(self, batch, logs=None):
        if self._probing or batch != self.at_batch:
            return
        from rnnmon.capture.fit_scope import FitScope

        self._probing = True
        try:
            callbacks = FitScope.find(self.model).call().callbacks
            list_type = type(callbacks)
            self.figures["callback list (every callback's batch hooks)"] = self._time(
                callbacks.on_train_batch_begin, callbacks.on_train_batch_end, logs)
            self.figures["callback list, its class's hooks (no guard)"] = self._time(
                lambda b: list_type.on_train_batch_begin(callbacks, b),
                lambda b, logs: list_type.on_train_batch_end(callbacks, b, logs), logs)
            for callback in callbacks.callbacks:
                name = type(callback).__name__
                if name == "UtilizationMonitor":
                    self.figures["monitor's own hooks"] = self._time(
                        callback.on_train_batch_begin, callback.on_train_batch_end, logs)
                elif callback is not self:
                    self.figures[f"{name} hooks as called"] = self._time(
                        callback.on_train_batch_begin, callback.on_train_batch_end, logs)
        finally:
            self._probing = False

    def _time(self, begin: Any, end: Any, logs: Any) -> float:
        start = time.thread_time_ns()
        for batch in range(self.calls):
            begin(batch)
            end(batch, logs)
        return (time.thread_time_ns() - start) / self.calls / 1e3


class _ReadyIterator:
    """Gives one batch forever; registered as a `tf.data.Iterator` so rnnmon's wrapper times it as one."""

    def __init__(self, batch: Any, element_spec: Any) -> None:
        self.batch, self.element_spec = batch, element_spec

    def __iter__(self) -> _ReadyIterator:
        return self

    def __next__(self) -> Any:
        return self.batch


def hot_path_us(calls: int = 2000, rounds: int = 5) -> dict[str, dict[str, Any]]:
    """CPU per step of each part of the step's path, in µs (medians over `rounds` of `calls` calls each).

    `hooks` (training-thread CPU): a `HookProbe` in a plain fit and in a fit with rnnmon. `train_function`
    (training-thread CPU, process CPU, wall): Keras's own train function on the iterator (the plain fit's path),
    and apart its compiled call (fetch and step in the graph, the outputs in an Optional) and the two eager ops
    that unpack the Optional; rnnmon's wrapper around the same function (`wrap_train_function` with a monitor's
    `on_wait`: an eager `next()`, then the function on that batch), and apart the eager `next()` and the function
    on a ready batch; the wrapper's own Python (a ready batch from a Python iterator, the step left out); and
    `batch_shapes` alone.
    """
    import tensorflow as tf

    from rnnmon.capture.input_timing import batch_shapes, closure, wrap_train_function

    hooks: dict[str, list[float]] = {}
    model, data = tiny_model(), dataset(64)
    for _repeat in range(rounds):
        for arm in ("plain", "rnnmon"):
            probe = HookProbe(calls)
            logdir = tempfile.mkdtemp(prefix="rnnmon-bench-")
            model.fit(data, epochs=1, verbose=0, callbacks=[*callbacks_for(arm, logdir), probe])
            for name, us in probe.figures.items():
                hooks.setdefault(f"{arm}: {name}", []).append(us)

    keras_function = model.train_function  # rnnmon's wrapper is gone once the fit ended
    iterator = iter(dataset(256).repeat())
    state = types.SimpleNamespace(wait=0.0, batches=0, shapes=None)

    def on_wait(seconds: float, batches: int, shapes: Any) -> None:  # what the monitor's `_on_wait` does
        state.wait, state.batches, state.shapes = seconds, batches, shapes

    def wrapped(function: Any) -> Any:
        stub = types.SimpleNamespace(train_function=function, steps_per_execution=1)
        wrap_train_function(stub, on_wait, lambda error: None, lambda caller: True)
        return stub.train_function

    batch = next(iterator)
    tf.data.Iterator.register(_ReadyIterator)
    ready = _ReadyIterator(batch, iterator.element_spec)
    timed_keras, timed_nothing = wrapped(keras_function), wrapped(lambda batches: None)
    on_iterator = closure(keras_function)["multi_step_on_iterator"]  # Keras's compiled fetch + step
    optional = on_iterator(iterator)
    parts = {
        "plain fit's path: Keras train function on the iterator": lambda: keras_function(iterator),
        "  its compiled part (in-graph fetch + step, an Optional out)": lambda: on_iterator(iterator),
        "  its two eager ops after it: has_value(), get_value()": lambda: optional.has_value() and optional.get_value(),
        "rnnmon's wrapper: eager next(), the function on that batch": lambda: timed_keras(iterator),
        "  eager next(iterator) alone": lambda: next(iterator),
        "  the function on a ready batch, no fetch": lambda: keras_function([batch]),
        "rnnmon's wrapper, its own Python (ready batch, no step)": lambda: timed_nothing(ready),
        "batch_shapes(batch)": lambda: batch_shapes(batch),
    }
    for part in parts.values():  # traces, and the wrapper's first-batch work
        part()
    timed: dict[str, list[tuple[float, float, float]]] = {}
    for _repeat in range(rounds):
        for name, part in parts.items():
            clocks = time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns()
            for _ in range(calls):
                part()
            now = time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns()
            timed.setdefault(name, []).append(tuple((b - a) / calls / 1e3 for a, b in zip(clocks, now)))
    return {"hooks": {name: round(statistics.median(v), 2) for name, v in hooks.items()},
            "train_function": {name: {clock: round(statistics.median(t[i] for t in v), 2)
                                      for i, clock in enumerate(("thread", "process", "wall"))}
                               for name, v in timed.items()}}


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


def _paired_difference(fits: dict[str, list[dict[str, float]]], arm: str, key: str) -> float:
    return statistics.median(b[key] - a[key] for a, b in zip(fits["plain"], fits[arm]))


def _paired_ratio(fits: dict[str, list[dict[str, float]]], arm: str, key: str) -> float:
    return round(statistics.median(b[key] / a[key] for a, b in zip(fits["plain"], fits[arm])), 4)


def _ms(seconds: float) -> float:
    return round(1e3 * seconds, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--spe", type=int, nargs="+", default=[1, 8], help="steps_per_execution values")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with fake_gpu() as gpu:
        results = [measure(args.steps, args.repeats, spe) for spe in args.spe]
        hot_path = hot_path_us()
        cycles = [cycles_after_fit(arm) for arm in ("plain", "rnnmon")]
    report = {"fake_gpu": gpu, "fits": results, "hot_path_us": hot_path, "cycles": cycles}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


def print_report(report: dict[str, Any]) -> None:
    """The report as tables (`--json` prints it as it is)."""
    results, hot_path = report["fits"], report["hot_path_us"]
    print(f"fake GPU: {report['fake_gpu']}; {results[0]['repeats']} rounds of {results[0]['steps']}-step fits, arms "
          "in rotating order; medians over rounds, added = median of (arm - plain fit of the same round)")
    for r in results:
        print(f"\nsteps_per_execution={r['steps_per_execution']}, load average {r['load_average'][0]} before, "
              f"{r['load_average'][1]} after ({os.cpu_count()} cores)")
        print(f"{'figure per step':<42}" + "".join(f"{arm:>20}" for arm in ARMS))
        for key, label, _, unit in FIGURES:
            cells = [f"{r['plain'][key]:.1f} {unit}"] + [
                f"{r[arm][key]:.1f}" + (f" ({r[arm]['added_' + key]:+.1f})" if key != "step_s" else "") + f" {unit}"
                for arm in ARMS[1:]]
            print(f"{label:<42}" + "".join(f"{cell:>20}" for cell in cells))
        rows = (("steady step ratio", "steady_ratio", ""), ("whole-fit ratio", "fit_ratio", ""),
                ("cost per fit (wall)", "cost_per_fit_ms", " ms"),
                ("training-thread CPU per fit beyond steady steps", "added_fixed_thread_cpu_ms", " ms"))
        for label, key, unit in rows:
            print(f"{label:<42}{'':>20}" + "".join(f"{r[arm][key]:>{20 - len(unit)}.3f}{unit}" for arm in ARMS[1:]))
        for label, key, unit in (("worst step", "worst_step_ms", " ms"), ("p99 step", "p99_step_ms", " ms"),
                                 ("rnnmon background threads, CPU", "background_cpu_pct", " %")):
            print(f"{label:<42}" + "".join(f"{r[arm][key]:>{20 - len(unit)}.3f}{unit}" for arm in ARMS))
    print("\nthe step's path, piece by piece, on the real objects (µs per step)")
    print("  batch hooks (training-thread CPU):")
    for name, us in hot_path["hooks"].items():
        print(f"    {name:<66}{us:>9.2f}")
    print(f"  train function:{'':>55}{'thread':>9}{'process':>9}{'wall':>9}")
    for name, clocks in hot_path["train_function"].items():
        print(f"    {name:<66}" + "".join(f"{clocks[c]:>9.1f}" for c in ("thread", "process", "wall")))
    for c in report["cycles"]:
        print(f"cycles after a fit ({c['arm']}): {c['cyclic_objects']} objects, {c['collect_ms']} ms to collect; "
              f"frames/tracebacks/iterators among them: {c['frames_tracebacks_iterators'] or 'none'}")


if __name__ == "__main__":
    main()
