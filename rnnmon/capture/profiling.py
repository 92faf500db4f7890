"""Captures a profiler trace of the next N training steps, for TensorBoard's Profile tab.

Only one profiler session can run in a process: when another one is active (for example the Keras
TensorBoard callback's `profile_batch`), the capture is skipped with a log line. TensorFlow and JAX have
profilers; on other backends the capture says it is unavailable.

Example:
    >>> capture = ProfileCapture("runs/exp1/rnnmon", steps=10)
    >>> capture.request("input_wait_high")      # any thread
    >>> capture.on_step()                       # the training thread, after each step
"""

from __future__ import annotations

import logging
import os

import keras

LOG = logging.getLogger("rnnmon")


class ProfileCapture:
    """Starts a trace on the training thread at the first step after `request()` and stops it `steps` later."""

    def __init__(self, log_dir: str, steps: int) -> None:
        self.log_dir = log_dir
        self.steps = steps
        self.pending = False  # read on every step: keep it a plain attribute
        self._reason = ""
        self._left = 0
        self._done = False

    def request(self, reason: str) -> None:
        """Ask for one capture (later requests are ignored once a capture ran)."""
        if self.steps and not self._done and not self.pending:
            self._reason = reason
            self.pending = True

    def on_step(self) -> None:
        """Called after each step while `pending`: starts the trace, then counts it down."""
        if self._left:
            self._left -= 1
            if not self._left:
                self.pending = False
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
            self._stop()
        self.pending = False

    def _start(self) -> bool:
        backend = keras.backend.backend()
        try:
            if backend == "tensorflow":
                import tensorflow as tf

                tf.profiler.experimental.start(self.log_dir)
            elif backend == "jax":
                import jax

                jax.profiler.start_trace(self.log_dir)
            else:
                LOG.warning("rnnmon: profiling on alert is unavailable on the %s backend.", backend)
                return False
        except Exception as error:  # another session is running, or the profiler is missing
            LOG.warning("rnnmon: could not start a profiler trace after %s (%s: %s); is another profiler "
                        "(e.g. TensorBoard(profile_batch=...)) running?", self._reason, type(error).__name__, error)
            return False
        LOG.warning("rnnmon: capturing a profiler trace of the next %d steps after %s into %s",
                    self.steps, self._reason, os.path.join(self.log_dir, "plugins", "profile"))
        return True

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
