"""`TrainingLoop`: a training loop written by hand, recorded as `fit` is (`UtilizationMonitor.loop()`).

A `GradientTape` step, a JAX step around `model.stateless_call`, a torch loop over a Keras model: the loop makes the
same `FitRun` the callback makes at `on_train_begin` (rnnmon.fit_run) and tells it the same events, so the run
has the same files, report, tab, alerts, Prometheus metrics, findings and worker folders as a fit.

- `batches(data)` is one epoch: each `next()` on `data` is timed as the step's input wait, and one iteration is
  one step. The input is audited the first time it is given (tf.data, generator, torch `DataLoader`).
- A step ends where the loop asks for the next batch, or earlier at `step_done(outputs)`, which waits until the
  device has finished with `outputs` (`jax.block_until_ready`; on TensorFlow and torch, the devices' queues).
  Without it, on JAX or a GPU (whose calls return before the device finishes), the device may still be working
  while the next batch is fetched: the input wait then includes time the device was busy, and the time the loop
  spends between steps (logging, say) is part of the step, not a host gap.
- `phase("validation")` (or `"epoch_end"`) marks time spent outside the training steps, as `fit`'s validation
  and epoch ends are.
- Leaving the `with` block ends the run: "finished", or "failed" / "interrupted" on an exception, after its last
  chunk is written. A loop left without it is ended ("aborted") by the monitor's next fit or loop, or at exit.

Example:
    >>> monitor = rnnmon.UtilizationMonitor("runs/exp1")
    >>> with monitor.loop(model) as loop:
    ...     for epoch in range(3):
    ...         for x, y in loop.batches(train_ds):
    ...             loss = train_step(x, y)
    ...             loop.step_done(loss)            # optional: the step ends when the device has finished
    ...         with loop.phase("validation"):
    ...             evaluate(val_ds)
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import keras

from rnnmon.audit.pipeline import input_kind
from rnnmon.capture.compiles import CompileWatch
from rnnmon.capture.eager_steps import EagerProbe
from rnnmon.capture.input_timing import batch_shapes
from rnnmon.fit_run import FitRun

if TYPE_CHECKING:
    from rnnmon.monitor import UtilizationMonitor

LOG = logging.getLogger("rnnmon")
PROBED_STEP = 3  # the run's step whose ops are counted: after the warm-up and the first steady ones
PHASES = {"validation": "eval", "eval": "eval", "epoch_end": "epoch_end"}  # a loop's phase names -> recorded kinds


class TrainingLoop:
    """One loop's record; made by `UtilizationMonitor.loop(model)`, used as a context manager."""

    def __init__(self, monitor: UtilizationMonitor, model: Any = None) -> None:
        self._monitor = monitor
        self._model = model
        self._run: FitRun | None = None
        self._entered = False
        self._epochs = 0
        self._in_step = False  # a batch was handed out and its step has not ended
        self._ended_at: float | None = None  # where the loop left `batches()` in the middle of a step
        self._probe: EagerProbe | None = None  # counts the ops one step dispatches from Python (capture.eager_steps)
        self._inputs: list[Any] = []  # the inputs already audited and described (kept: compared by identity)

    @property
    def stop_requested(self) -> bool:
        """True once an alert in `stop_on_alert` fired: `batches()` then ends the epoch, and the loop should stop."""
        return self._run is not None and self._run.stop_requested

    def __enter__(self) -> TrainingLoop:
        monitor = self._monitor
        monitor.end_stale_runs()
        if monitor.worker is None and keras.backend.backend() == "jax":
            monitor.learn_jax_worker()
        monitor.run_dir = monitor._run_dir(None)
        self._entered = True
        try:
            run = FitRun(monitor, self._model, monitor.run_dir, trial=None, input_kind=None,
                         first_step=monitor._global_step)
        except Exception as error:  # e.g. an unwritable log_dir: train anyway, unmonitored
            LOG.error("rnnmon: monitoring is off for this loop: %s: %s", type(error).__name__, error)
            return self
        monitor._run = self._run = run
        run.start(input_wait="measured", audit_input=False)
        if keras.backend.backend() == "jax":  # JAX's compile events come from the process, not from a model
            run.watch_compiles(CompileWatch.for_model(None, "jax"))
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> None:
        run, self._run = self._run, None
        self._entered = False
        if run is None:
            return
        if error is None:
            self._end_step(run.clock())
            run.finish("finished")
        else:
            run.failed(error)
        if self._monitor._run is run:
            self._monitor._run = None
            self._monitor._global_step = run.global_step

    def batches(self, data: Iterable[Any]) -> Iterator[Any]:
        """One epoch over `data`: yields its batches, timing each fetch as the next step's input wait."""
        run = self._run
        if run is None:
            if not self._entered:
                raise RuntimeError("loop.batches() is used inside `with monitor.loop() as loop:`.")
            yield from data  # monitoring is off: the batches pass through
            return
        if not any(data is seen for seen in self._inputs):
            self._inputs.append(data)
            self._describe_input(run, data)
        run.epoch = self._epochs
        self._epochs += 1
        iterator = iter(data)
        first = run.steps == 0
        try:
            while run.active and not run.stop_requested:
                start = run.clock()
                self._end_step(start)  # the last step ends where the next batch is asked for
                try:
                    batch = next(iterator)
                except StopIteration:
                    run.epoch_ends(run.clock())
                    return
                wait = run.clock() - start
                if first:  # (measuring the fetch floor lies in the warm-up, as the first step does)
                    first = False
                    self._first_batch(run, batch, iterator)
                run.step_starts((wait, 1, batch_shapes(batch)))
                run.step_begins(run.clock())
                self._in_step = True
                if run.steps == PROBED_STEP and self._probe is None:  # does the step run op by op?
                    self._probe = EagerProbe(keras.backend.backend())
                    self._probe.start()
                yield batch
        finally:  # the loop left the epoch (a break, or an exception): its step ended now, unless it raised
            if self._in_step and self._ended_at is None:
                self._ended_at = run.clock()
            if self._probe is not None:
                self._probe.stop()

    def _stop_probe(self) -> None:
        probed = self._probe.stop() if self._probe is not None else None
        if probed is not None and self._run is not None:
            self._run.describe(eager_probe={**probed, "step": self._run.global_step + 1})

    def _end_step(self, now: float) -> None:
        self._stop_probe()
        if self._in_step and self._run is not None:
            self._in_step = False
            self._run.step_ends(self._ended_at if self._ended_at is not None else now)
        self._ended_at = None

    def step_done(self, outputs: Any = None) -> None:
        """End the step once the device has finished it: waits for `outputs` (JAX arrays; on TensorFlow and torch
        for the devices' queues, with or without outputs)."""
        run = self._run
        if run is None or not self._in_step:
            return
        self._stop_probe()  # (waiting for the device dispatches ops of its own)
        _wait_for_device(outputs)
        self._end_step(run.clock())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time spent in `name` ("validation" or "epoch_end"): recorded as fit's validation and epoch ends are."""
        if name not in PHASES:
            raise ValueError(f"name must be one of {sorted(PHASES)}. Received: name={name!r}")
        run = self._run
        if run is None:
            yield
            return
        self._end_step(run.clock())
        if PHASES[name] == "eval":
            run.validation_begins(run.clock(), warm_up=False)
        else:
            run.epoch_ends(run.clock())
        yield
        run.epoch_ends(run.clock())

    def _describe_input(self, run: FitRun, data: Any) -> None:
        """The input's kind, cache and batching in the run description, and its audit (as fit's input gets)."""
        run.input_kind = input_kind(data)
        run.describe(**run.input_facts(data))
        run.audit_input(data)

    def _first_batch(self, run: FitRun, batch: Any, iterator: Any) -> None:
        tf = sys.modules.get("tensorflow")
        if tf is not None and isinstance(iterator, tf.data.Iterator):
            run.first_batch(batch, iterator)


def _wait_for_device(outputs: Any) -> None:
    """Block until the device has finished computing `outputs` (and, on TF and torch, all queued work)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        jax.block_until_ready(outputs)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.test.experimental.sync_devices()
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
