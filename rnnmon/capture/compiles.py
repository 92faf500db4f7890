"""Counts the compiles of a fit's training step from the framework's own signals, never from durations.

- TensorFlow: the tracing count of Keras's step `tf.function`s (`experimental_get_tracing_count`); with XLA
  (`jit_compile=True`) also every input signature new to Keras's train function (kept across the fits that reuse
  it), because XLA compiles each signature once (its compile cache is keyed on the input shapes). TensorFlow
  times neither: the analysis takes a compile's cost as its step's time beyond a step on shapes already seen.
- JAX: `jax.monitoring`'s compile events (`/jax/core/compile/backend_compile_duration`, with the tracing and
  lowering before it), counted and timed as they happen.
- torch with `jit_compile=True`: `torch.compile`'s (dynamo's) count of graphs it compiled.

`ShapeSteps` keeps what each input shape's steps cost, so that a fix (one padded length, buckets) can be
predicted from the run's own numbers (rnnmon.analysis.compile_advice).

Example:
    >>> watch = CompileWatch.for_model(model, "jax")
    >>> count, seconds = watch.take(begin, end, shapes)   # at each step's end
"""

from __future__ import annotations

import collections
import math
import threading
import time
import weakref
from typing import Any

from rnnmon.capture.input_timing import Shapes, closure

JAX_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                      "/jax/core/compile/backend_compile_duration")
_JAX_BACKEND_COMPILE = JAX_COMPILE_EVENTS[-1]
_XLA_SIGNATURES: weakref.WeakKeyDictionary[Any, set[Shapes]] = weakref.WeakKeyDictionary()  # per step function
_JAX_LIVE: list[_JaxWatch] = []  # the watches of fits running now (JAX keeps one listener per process)
_JAX_LOCK = threading.Lock()
_JAX_LISTENING: list[bool] = []  # [True] once the listener is registered
MAX_SHAPES = 512  # distinct input shapes whose steps are costed; more are left out (and said so)


class CompileWatch:
    """The step function's compiles since the last `take`, from one framework's signal (`source`)."""

    source = ""  # "tf.function", "xla", "jax", "torch.compile"; "" where nothing can be watched

    @staticmethod
    def for_model(model: Any, backend: str) -> CompileWatch:
        """The watch for `model`'s training step on `backend` (a watch of nothing where there is no signal)."""
        try:
            if backend == "tensorflow":
                return _TensorFlowWatch(model)
            if backend == "jax":
                return _JaxWatch()
            if backend == "torch" and getattr(model, "jit_compile", False):
                return _TorchWatch()
        except Exception:  # a framework without the signal: recompiles go unnamed rather than guessed
            pass
        return CompileWatch()

    def take(self, begin: float, end: float, shapes: Shapes | None) -> tuple[int, float]:
        """(compiles, their measured seconds or NaN) of the step from `begin` to `end` (perf_counter seconds)
        whose batch had input `shapes` (None where the batches did not pass through rnnmon)."""
        return 0, math.nan

    def close(self) -> None:
        """Stop listening (the fit has ended)."""


class _TensorFlowWatch(CompileWatch):
    """Tracing counts of the step `tf.function`s Keras's `train_function` closes over; XLA: new signatures."""

    def __init__(self, model: Any) -> None:
        self._xla = bool(getattr(model, "jit_compile", False))
        self.source = "xla" if self._xla else "tf.function"
        self._functions = _step_functions(model.train_function)
        self._traced = self._count()
        # XLA's programs live as long as Keras's step function: a later fit on the same one compiles nothing new
        self._signatures = _XLA_SIGNATURES.setdefault(self._functions[0], set()) if self._functions else set()

    def _count(self) -> int:
        return sum(function.experimental_get_tracing_count() for function in self._functions)

    def take(self, begin: float, end: float, shapes: Shapes | None) -> tuple[int, float]:
        traced, self._traced = self._traced, self._count()
        compiled = self._xla and shapes is not None and shapes not in self._signatures
        if compiled:
            self._signatures.add(shapes)
        return (self._traced - traced) or int(compiled), math.nan


def _step_functions(train_function: Any) -> list[Any]:
    """The `tf.function`s reached from Keras's `train_function` through its closures (`one_step_on_data`,
    `multi_step_on_iterator`, and what they wrap), rnnmon's own wrappers looked through."""
    found, pending, seen = [], [train_function], set()
    while pending:
        function = pending.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        if hasattr(function, "experimental_get_tracing_count"):
            found.append(function)
            function = getattr(function, "python_function", None)
        original = getattr(function, "__rnnmon_original__", None) or getattr(function, "__wrapped__", None)
        pending.extend(value for value in (original, *closure(function).values()) if callable(value))
    return found


class _JaxWatch(CompileWatch):
    """JAX's compile events while the fit runs: one listener per process, handing events to live watches."""

    source = "jax"

    def __init__(self) -> None:
        import jax.monitoring

        self._events: list[tuple[float, float, bool]] = []  # (when, seconds, is the backend compile)
        with _JAX_LOCK:
            if not _JAX_LISTENING:
                jax.monitoring.register_event_duration_secs_listener(_on_jax_event)
                _JAX_LISTENING.append(True)
            _JAX_LIVE.append(self)

    def take(self, begin: float, end: float, shapes: Shapes | None) -> tuple[int, float]:
        if not self._events:
            return 0, math.nan
        inside = [event for event in self._events if begin <= event[0] <= end]
        self._events = [event for event in self._events if event[0] > end]
        count = sum(1 for _, _, compiled in inside if compiled)
        return count, (sum(seconds for _, seconds, _ in inside) if count else math.nan)

    def close(self) -> None:
        with _JAX_LOCK:
            if self in _JAX_LIVE:
                _JAX_LIVE.remove(self)


def _on_jax_event(event: str, duration_secs: float, **_: Any) -> None:
    """JAX's listener (registered once; `jax.monitoring` keeps listeners for the process's life)."""
    if event in JAX_COMPILE_EVENTS:
        now = time.perf_counter()
        for watch in list(_JAX_LIVE):
            watch._events.append((now, float(duration_secs), event == _JAX_BACKEND_COMPILE))


class _TorchWatch(CompileWatch):
    """dynamo's count of the graphs `torch.compile` compiled (Keras compiles the step with it at jit_compile)."""

    source = "torch.compile"

    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        self._stats = counters["stats"]
        self._graphs = self._stats["unique_graphs"]

    def take(self, begin: float, end: float, shapes: Shapes | None) -> tuple[int, float]:
        graphs, self._graphs = self._graphs, self._stats["unique_graphs"]
        return self._graphs - graphs, math.nan


class ShapeSteps:
    """Per input shape, the steps taken on it and what those that compiled nothing cost: the run's cost of a step
    against its sequence length. `add` (one deque append) runs on the training thread, `drain` on the writer's."""

    def __init__(self) -> None:
        self._steps: collections.deque[tuple[Shapes, int, float, bool]] = collections.deque()
        self._known: set[Shapes] = set()
        self.left_out = 0  # steps on shapes beyond the first MAX_SHAPES

    def add(self, shapes: Shapes, batches: int, seconds: float, compiled: bool) -> None:
        self._steps.append((shapes, batches, seconds, compiled))

    def drain(self) -> list[dict[str, Any]]:
        """The steps added since the last drain, one record per shape (records add up across drains)."""
        totals: dict[Shapes, list[float]] = {}  # shapes -> [steps, plain steps, plain seconds]
        for _ in range(len(self._steps)):
            shapes, batches, seconds, compiled = self._steps.popleft()
            if shapes not in self._known:
                if len(self._known) >= MAX_SHAPES:
                    self.left_out += batches
                    continue
                self._known.add(shapes)
            entry = totals.setdefault(shapes, [0, 0, 0.0])
            entry[0] += batches
            if not compiled:
                entry[1] += batches
                entry[2] += seconds
        return [{"shapes": shape_list(shapes), "steps": int(steps), "plain_steps": int(plain),
                 "plain_s": round(seconds, 6)} for shapes, (steps, plain, seconds) in totals.items()]


def shape_list(shapes: Shapes) -> list[list[int | None] | None]:
    """`shapes` as JSON stores them: one list of sizes (None where unknown) per array."""
    return [None if shape is None else [size if isinstance(size, int) else None for size in shape]
            for shape in shapes]
