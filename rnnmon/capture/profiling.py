"""Captures a profiler trace of the next N training steps, for TensorBoard's Profile tab.

Only one profiler session can run in a process: when another one is active (for example the Keras
TensorBoard callback's `profile_batch`), the capture is skipped with a log line. TensorFlow and JAX have
profilers; on other backends the capture says it is unavailable.

The Profile tab (XProf) groups a TensorFlow trace into steps by step markers. While a capture runs, each timed
step, the batch fetch included, is wrapped in a `train` marker (`step_marker`): XProf then finds the steps and
how much of each the input took. A `tf.while_loop` defeats that grouping (each loop iteration takes over), and
a default LSTM/GRU runs one in every step without a GPU, or where it misses the cuDNN kernel: for such a model
(`loop_note`) the alert, the log line and the run's `profile` record say so, and that rnnmon's own per-step
timings are the measure.

Example:
    >>> capture = ProfileCapture("runs/exp1/rnnmon", steps=10, model=model)
    >>> capture.request("input_wait_high")      # any thread
    >>> capture.on_step()                       # the training thread, after each step
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

import keras

from rnnmon.audit.rnn_layers import while_loop_layers

LOG = logging.getLogger("rnnmon")

SHORT_SEQUENCE = 32  # up to this many timesteps, unrolling the RNN (or XLA) is a fair way to lose the loop


def loop_note(model: Any, backend: str | None = None) -> str:
    """Why the Profile tab cannot group `model`'s steps on TensorFlow ("" where it can): its RNN layers that run a
    `tf.while_loop` in every step (`while_loop_layers`), unless the model compiles with `jit_compile=True`."""
    if (backend or keras.backend.backend()) != "tensorflow" or getattr(model, "jit_compile", False) is True:
        return ""
    import tensorflow as tf

    looped = while_loop_layers(model, gpu=bool(tf.config.list_logical_devices("GPU")))
    if not looped:
        return ""
    names = ", ".join(f"'{where}'" for where in looped)
    note = (f"The Profile tab cannot group this model's steps: its RNN layer(s) {names} run a tf.while_loop in "
            "every step, and XProf takes the loop's iterations for its steps (\"No step marker observed\"). The "
            "trace still shows the ops; rnnmon's own per-step timings (step time, input wait, host gap) are the "
            "measure.")
    timesteps = _timesteps(model)
    if timesteps is not None and timesteps <= SHORT_SEQUENCE:
        note += (f" With {timesteps} timesteps, `unroll=True` on the RNN layers or `model.compile(..., "
                 "jit_compile=True)` removes the loop for a profiling run, and the Profile tab then groups the "
                 "steps (on a GPU, unrolling gives up the cuDNN kernel).")
    return note


def _timesteps(model: Any) -> int | None:
    """The sequence length of the model's first input, where its shape fixes one (batch, timesteps, ...)."""
    try:
        shape = tuple(keras.tree.flatten(model.inputs)[0].shape)
    except (AttributeError, IndexError, TypeError, ValueError):  # a subclassed model has no symbolic inputs
        return None
    return shape[1] if len(shape) >= 3 and isinstance(shape[1], int) else None


class ProfileCapture:
    """Starts a trace on the training thread at the first step after `request()` and stops it `steps` later.

    `on_record(record)` gets the capture's outcome once it started or failed: the alert rule, the steps, the
    trace folder, whether steps were marked, and the note for a model whose steps the Profile tab cannot group.
    The trace is written under `log_dir`; the log line and the record name it under `shown_dir` (default
    `log_dir`): for a remote log directory, the run's folder in the bucket, as the staging folder is emptied.
    """

    def __init__(self, log_dir: str, steps: int, model: Any = None,
                 on_record: Callable[[dict[str, Any]], None] | None = None, shown_dir: str | None = None) -> None:
        self.log_dir = log_dir
        self.shown_dir = shown_dir or log_dir
        self.steps = steps
        self.pending = False  # read on every step: keep it a plain attribute
        self._model = model
        self._on_record = on_record
        self._note: str | None = None
        self._reason = ""
        self._left = 0
        self._marked = 0  # step markers to put into the running trace (0: none)
        self._done = False

    @property
    def note(self) -> str:
        """`loop_note` for the model (worked out once)."""
        if self._note is None:
            self._note = loop_note(self._model) if self._model is not None else ""
        return self._note

    def will_capture(self) -> bool:
        """Whether the next `request()` starts a capture (none ran or is waiting)."""
        return bool(self.steps) and not self._done and not self.pending

    def request(self, reason: str) -> None:
        """Ask for one capture (later requests are ignored once a capture ran)."""
        if self.will_capture():
            self._reason = reason
            self.pending = True

    def step_marker(self) -> contextlib.AbstractContextManager | None:
        """A `train` step marker for the next step while a trace that can group steps runs, else None."""
        if not self._marked:
            return None
        import tensorflow as tf

        step = self.steps - self._marked
        self._marked -= 1
        return tf.profiler.experimental.Trace("train", step_num=step, _r=1)

    def on_step(self) -> None:
        """Called after each step while `pending`: starts the trace, then counts it down."""
        if self._left:
            self._left -= 1
            if not self._left:
                self.pending = False
                self._marked = 0
                self._stop()
            return
        self._done = True
        if self._start():
            self._left = self.steps  # stay pending: the steps are counted until the trace stops
        else:
            self.pending = False

    @property
    def tracing(self) -> bool:
        """Whether a trace is running: it flips in the `on_step` that starts it and in the one that stops it."""
        return bool(self._left)

    def close(self) -> None:
        if self._left:
            self._left = 0
            self._marked = 0
            self._stop()
        self.pending = False

    def _start(self) -> bool:
        backend = keras.backend.backend()
        folder = (f"{self.shown_dir.rstrip('/')}/plugins/profile" if "://" in self.shown_dir  # a bucket's URL
                  else os.path.join(self.shown_dir, "plugins", "profile"))
        record: dict[str, Any] = {"rule": self._reason, "steps": self.steps, "dir": folder}
        try:
            if backend == "tensorflow":
                import tensorflow as tf

                tf.profiler.experimental.start(self.log_dir)
            elif backend == "jax":
                import jax

                jax.profiler.start_trace(self.log_dir)
            else:
                LOG.warning("rnnmon: profiling on alert is unavailable on the %s backend.", backend)
                self._record(record, f"unavailable on the {backend} backend")
                return False
        except Exception as error:  # another session is running, or the profiler is missing
            LOG.warning("rnnmon: could not start a profiler trace after %s (%s: %s); is another profiler "
                        "(e.g. TensorBoard(profile_batch=...)) running?", self._reason, type(error).__name__, error)
            self._record(record, f"not started: {type(error).__name__}: {error}")
            return False
        note = self.note
        self._marked = self.steps if backend == "tensorflow" and not note else 0
        LOG.warning("rnnmon: capturing a profiler trace of the next %d steps after %s into %s%s", self.steps,
                    self._reason, folder, f". {note}" if note else "")
        self._record(dict(record, step_markers=bool(self._marked), note=note), "captured")
        return True

    def _record(self, record: dict[str, Any], status: str) -> None:
        if self._on_record is not None:
            self._on_record(dict(record, status=status))

    def _stop(self) -> None:
        backend = keras.backend.backend()
        try:
            if backend == "tensorflow":
                import tensorflow as tf

                tf.profiler.experimental.stop()
            else:
                import jax

                jax.profiler.stop_trace()
        except Exception as error:
            LOG.warning("rnnmon: stopping the profiler trace failed (%s: %s)", type(error).__name__, error)
