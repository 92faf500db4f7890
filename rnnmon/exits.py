"""Gets the record to disk however a fit ends: SIGTERM, Ctrl-C (SIGINT) or interpreter exit.

Handlers are installed only from the main thread, chain to whatever was there before, and are removed again
by `release()`.

Example:
    >>> guard = ExitGuard(lambda status: monitor_finish(status))
    >>> guard.install()     # at on_train_begin
    >>> guard.release()     # at on_train_end
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

_STATUS = {signal.SIGTERM: "terminated", signal.SIGINT: "interrupted"}


class ExitGuard:
    """Calls `finish(status)` once when the process is told to stop or exits while a fit is running."""

    def __init__(self, finish: Callable[[str], None]) -> None:
        self._finish = finish
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        atexit.register(self._at_exit)
        if threading.current_thread() is threading.main_thread():
            for signum in _STATUS:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def release(self) -> None:
        atexit.unregister(self._at_exit)
        if threading.current_thread() is threading.main_thread():
            for signum, previous in self._previous.items():
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, previous)
        self._previous = {}

    def _at_exit(self) -> None:
        self._finish("aborted")

    def _on_signal(self, signum: int, frame: Any) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        self._finish(_STATUS[signum])  # releases this guard, restoring `previous`
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
