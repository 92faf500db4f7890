"""Times the input-pipeline wait inside Keras's `train_function`, where callbacks cannot see it.

TensorFlow backend: Keras 3 fetches the batch inside the compiled function. The wrapper pulls the step's
batch(es) with `next(iterator)` on the host, timed, and hands them to the original function, which runs the same
compiled step on each through its non-iterator branch: one batch is pulled, stepped on, then the next, as the
in-graph loop does. Losses and weights are unchanged. With `steps_per_execution > 1` pulling eagerly costs
0.2-0.9 ms a batch more than Keras's in-graph loop (a dispatch per batch, on a 1.5-2 ms tiny-LSTM step), so only a
sample is pulled, timed and reported: the fit's first execution (its warm-up, which then also readies the in-graph
loop), its second, and every `sample_every`-th after that; the others run Keras's loop untouched and report
nothing (their wait is NaN: not measured). Eager batches
have concrete shapes, so before the first step the wrapper traces Keras's per-batch step for the iterator's
own element spec (batch dimension unknown), as Keras's in-graph loop would: the partial last batch of an
epoch then reuses that trace instead of tracing again (0.5-1 s on a small LSTM).

JAX backend: Keras calls `next(iterator)` in Python inside `train_function(state, iterator)`, so the wrapper
hands it the same iterator behind a proxy that times each `next`. torch backend: the epoch loop fetches the
batch before `on_train_batch_begin`; `EpochIteratorTiming` puts the same proxy around its data iterator.

Each step also reports the shapes of its first batch's arrays (`batch_shapes`, about 1.5 µs), so that a step that
compiled again for a new input shape (a partial last batch, a new sequence length) can be named.

Example:
    >>> wrap_train_function(model, on_wait=lambda seconds, batches, shapes: ..., on_error=lambda error: ...,
    ...                     live=lambda caller: True, sample_every=SAMPLE_EVERY)
    >>> model.fit(dataset)                    # executions 1, 17, 33, ... of model.train_function report their wait
    >>> unwrap_train_function(model)
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

_ORIGINAL = "__rnnmon_original__"
SAMPLE_EVERY = 16  # at steps_per_execution > 1 on TensorFlow: one execution in this many is pulled in Python, timed


Shapes = tuple[tuple[int | None, ...] | None, ...]  # one entry per array of a batch, in order


def batch_shapes(batch: Any) -> Shapes:
    """The shapes of the arrays in `batch` (nested tuples, lists and dicts), in order; None for a leaf without one."""
    leaves: list[tuple[int | None, ...] | None] = []
    pending = [batch]
    while pending:
        item = pending.pop()
        if isinstance(item, (tuple, list)):
            pending.extend(reversed(item))
        elif isinstance(item, dict):
            pending.extend(item[key] for key in sorted(item, key=str, reverse=True))
        else:
            # An eager tensor's `_shape_tuple()` is its shape without building a TensorShape: 0.3 µs, not 1 µs.
            shape_tuple = getattr(item, "_shape_tuple", None)
            try:
                leaves.append(shape_tuple() if shape_tuple is not None else tuple(item.shape))
            except (AttributeError, TypeError, ValueError):  # no shape, or an unknown rank
                leaves.append(None)
    return tuple(leaves)


def wrap_train_function(model: Any, on_wait: Callable[[float, int, Shapes | None], None],
                        on_error: Callable[[BaseException], None], live: Callable[[FrameType], bool],
                        on_first_batch: Callable[[Any, Any], None] | None = None,
                        step_marker: Callable[[], contextlib.AbstractContextManager | None] | None = None,
                        sample_every: int = 1) -> None:
    """Replace `model.train_function` with a timed one (removing a stale wrapper from an aborted fit).

    `on_wait(seconds, batches, shapes)` gets each timed step's wait, batch count and first batch's shapes: every
    step's where `sample_every` is 1, else executions 0, 1, 1 + `sample_every`, 1 + 2 * `sample_every`, ... of
    the fit (the others are not timed and call nothing).
    `on_first_batch` gets the first batch the wrapper fetched and the iterator it came from, before the step runs
    on it. `step_marker()` gives a context (a profiler step marker) to wrap the whole step in, fetch included, or
    None (every step outside a capture).

    Once `live(caller_frame)` is False (its monitor has stopped, or its fit is over) the wrapper passes the
    call straight through and removes itself.
    """
    import tensorflow as tf

    unwrap_train_function(model)
    original = model.train_function
    per_execution = int(model.steps_per_execution)
    iterator_types = (tf.data.Iterator, tf.distribute.DistributedIterator)
    clock = time.perf_counter

    pending = {"trace", "first batch"}
    executions = itertools.count()

    def timed_train_function(iterator: Any) -> Any:
        if not live(sys._getframe(1)):
            return _step_aside(model, timed_train_function, original)(iterator)
        if not isinstance(iterator, iterator_types):
            return original(iterator)
        if "trace" in pending:  # in the fit's first execution, its warm-up, whether timed or not
            pending.discard("trace")
            _trace_for_any_batch_size(original, iterator.element_spec)
        execution = next(executions)
        step = timed_step if sample_every == 1 or execution % sample_every == 1 or execution == 0 else untimed_step
        marker = step_marker() if step_marker is not None else None
        with marker if marker is not None else contextlib.nullcontext():
            result = step(iterator)
        if sample_every > 1 and execution == 0:  # still the warm-up: ready the in-graph loop too
            _run_loop_once(original, iterator)
        return result

    def untimed_step(iterator: Any) -> Any:
        """Keras's in-graph loop, as without rnnmon."""
        try:
            return original(iterator)
        except StopIteration:
            raise
        except BaseException as error:
            on_error(error)
            raise

    def timed_step(iterator: Any) -> Any:
        try:
            start = clock()
            first = next(iterator, None)
            waited = clock() - start
            if first is None:
                on_wait(waited, 0, None)
                raise StopIteration
            if "first batch" in pending:
                pending.discard("first batch")
                if on_first_batch is not None:
                    on_first_batch(first, iterator)
            if per_execution == 1:
                result = original([first])
                on_wait(waited, 1, batch_shapes(first))
                return result
            rest = _TimedIterator(iterator)  # pulled one by one as Keras steps on them
            result = original(itertools.chain((first,), rest))
            on_wait(waited + rest.waited_s, 1 + rest.batches, batch_shapes(first))
            return result
        except StopIteration:
            raise
        except BaseException as error:
            on_error(error)
            raise

    setattr(timed_train_function, _ORIGINAL, original)
    model.train_function = timed_train_function


def _trace_for_any_batch_size(train_function: Any, element_spec: Any) -> None:
    """Trace Keras's per-batch `tf.function` for `element_spec`, so every batch size dispatches to one trace.

    The step function is reached through the names Keras's `train_function` closes over
    (`one_step_on_data`, wrapped once as `step_func`); if they are not there, batches keep Keras's own
    retracing (once per new batch shape).
    """
    step = closure(train_function).get("one_step_on_data")
    step = closure(step).get("step_func", step)
    if hasattr(step, "get_concrete_function"):
        # A spec the step does not take as is (e.g. a distributed one) leaves Keras tracing as before.
        with contextlib.suppress(Exception):
            step.get_concrete_function(element_spec)


def _run_loop_once(train_function: Any, iterator: Any) -> None:
    """Call Keras's in-graph loop on an empty iterator of `iterator`'s element spec: no step runs, but the loop is
    traced and its first call's setup (0.3-0.6 s on a small LSTM) is paid here, in the fit's warm-up, rather than in
    the first execution left to it. Only for a plain tf.data iterator; anything unexpected leaves it to that call."""
    import tensorflow as tf

    if isinstance(iterator, tf.distribute.DistributedIterator) or not isinstance(iterator, tf.data.Iterator):
        return
    with contextlib.suppress(Exception):  # StopIteration, as the loop ran no step
        spec = iterator.element_spec
        train_function(iter(tf.data.Dataset.from_generator(lambda: iter(()), output_signature=spec)))


def closure(function: Any) -> dict[str, Any]:
    """The names `function` closes over and their values (cells not yet filled left out)."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None) or ()
    if code is None:
        return {}
    found = {}
    for name, cell in zip(code.co_freevars, cells):
        with contextlib.suppress(ValueError):  # an empty cell
            found[name] = cell.cell_contents
    return found


def wrap_jax_train_function(model: Any, on_wait: Callable[[float, int, Shapes | None], None],
                            on_error: Callable[[BaseException], None], live: Callable[[FrameType], bool]) -> None:
    """Replace `model.train_function(state, iterator)` with one that times every `next(iterator)` it makes."""
    unwrap_train_function(model)
    original = model.train_function

    def timed_train_function(state: Any, iterator: Any) -> Any:
        if not live(sys._getframe(1)):
            return _step_aside(model, timed_train_function, original)(state, iterator)
        timed = _TimedIterator(iterator)
        try:
            result = original(state, timed)
        except StopIteration:
            raise
        except BaseException as error:
            on_error(error)
            raise
        on_wait(timed.waited_s, timed.batches, timed.shapes)
        return result

    setattr(timed_train_function, _ORIGINAL, original)
    model.train_function = timed_train_function


def _step_aside(model: Any, wrapper: Callable, original: Callable) -> Callable:
    """A wrapper whose monitor has stopped puts Keras's function back (if still in place) and returns it."""
    if model.train_function is wrapper:
        model.train_function = original
    return original


class _TimedIterator:
    """Passes batches through, adding up the time each `next` took; `shapes` are the first batch's."""

    __slots__ = ("_iterator", "batches", "shapes", "waited_s")

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self.batches = 0
        self.waited_s = 0.0
        self.shapes: Shapes | None = None

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            batch = next(self._iterator)
        finally:
            self.waited_s += time.perf_counter() - start
        self.batches += 1  # (an iterator that ran out fetched no batch)
        if self.shapes is None:
            self.shapes = batch_shapes(batch)
        return batch


class EpochIteratorTiming:
    """Times the batches Keras's torch epoch loop fetches (before `on_train_batch_begin`, outside any hook).

    The epoch iterator makes each epoch's data iterator with `_get_iterator()`; an instance attribute of that
    name wraps what it returns in a timing proxy. `take()` gives the wait since the last call.
    """

    def __init__(self, epoch_iterator: Any) -> None:
        original = epoch_iterator._get_iterator
        self._timed = _TimedIterator(iter(()))

        def timed_iterator() -> _TimedIterator:
            self._timed = _TimedIterator(iter(original()))
            return self._timed

        epoch_iterator._get_iterator = timed_iterator

    def take(self) -> tuple[float, int, Shapes | None]:
        """(seconds waited, batches fetched, the first one's shapes) since the last call."""
        timed = self._timed
        taken = timed.waited_s, timed.batches, timed.shapes
        timed.waited_s, timed.batches, timed.shapes = 0.0, 0, None
        return taken


def unwrap_train_function(model: Any) -> None:
    """Put back the function Keras made, however many rnnmon wrappers sit on it."""
    function = getattr(model, "train_function", None)
    while hasattr(function, _ORIGINAL):
        function = getattr(function, _ORIGINAL)
    if function is not getattr(model, "train_function", None):
        model.train_function = function
