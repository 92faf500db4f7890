"""A daemon thread that calls one function at a fixed rate without drifting.

Example:
    >>> ticker = Ticker(0.5, sampler.poll)
    >>> ticker.start(); ...; ticker.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LOG = logging.getLogger("rnnmon")


class Ticker:
    """Runs `tick()` every `interval_s` on a daemon thread until `stop()`; a failing tick is logged once."""

    def __init__(self, interval_s: float, tick: Callable[[], None], name: str = "rnnmon-sampler") -> None:
        self._interval_s = interval_s
        self._tick = tick
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._failed = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        due = time.monotonic()
        while True:
            due += self._interval_s
            if self._stopped.wait(max(0.0, due - time.monotonic())):
                return
            due = max(due, time.monotonic() - self._interval_s)  # after a stall, skip missed ticks
            try:
                self._tick()
            except Exception:  # monitoring must never stop training
                if not self._failed:
                    self._failed = True
                    LOG.exception("rnnmon: background sampling failed; it keeps trying.")
