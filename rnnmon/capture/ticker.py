"""A daemon thread that calls one function at a fixed rate without drifting.

rnnmon runs two: one polls NVML, one writes to disk, so a hung driver call never holds up the writes (and a hung
disk never holds up the polls).

Example:
    >>> ticker = Ticker(0.5, sampler.poll, name="rnnmon-sampler")
    >>> ticker.start(); ...; ticker.stop(timeout_s=1.0)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LOG = logging.getLogger("rnnmon")


class Ticker:
    """Runs `tick()` every `interval_s` on a daemon thread until `stop()`, then `on_stop()` once.

    Anything a tick raises, `SystemExit` and `KeyboardInterrupt` included, is logged once and the ticking goes on:
    monitoring must never end a fit, nor die silently.
    """

    def __init__(self, interval_s: float, tick: Callable[[], None], name: str = "rnnmon-sampler",
                 on_stop: Callable[[], None] | None = None) -> None:
        self._interval_s = interval_s
        self._tick = tick
        self._on_stop = on_stop
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._failed = False

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Ask the thread to end and wait up to `timeout_s` (not at all from the thread itself); True once ended."""
        self._stopped.set()
        if self._thread is threading.current_thread():
            return False
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            due = time.monotonic()
            while True:
                due += self._interval_s
                if self._stopped.wait(max(0.0, due - time.monotonic())):
                    return
                due = max(due, time.monotonic() - self._interval_s)  # after a stall, skip missed ticks
                self._guarded(self._tick)
        finally:
            if self._on_stop is not None:
                self._guarded(self._on_stop)

    def _guarded(self, function: Callable[[], None]) -> None:
        try:
            function()
        except BaseException:  # monitoring must never stop training
            if not self._failed:
                self._failed = True
                LOG.exception("rnnmon: %s failed; it keeps going.", self._thread.name)
