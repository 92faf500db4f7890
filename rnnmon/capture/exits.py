"""Gets the record to disk however a fit ends: SIGTERM, Ctrl-C (SIGINT) or interpreter exit.

Handlers are installed only from the main thread, chain to whatever was there before, and are removed again
by `release()`. A signal the process ignores stays ignored (a `cmd &` job of a non-interactive shell, `nohup cmd &`
included, ignores SIGINT), and one whose handler was set outside Python is left alone: rnnmon installs nothing
for either, so neither ends the record of a fit that trains on. They act only in the process that installed
them: a forked child (a `PyDataset` worker, a `multiprocessing` pool started in a callback) gets them disarmed by
`os.register_at_fork`, and a handler that still runs in another process (a fork that skipped the at-fork hooks)
just does what was there before.

Example:
    >>> guard = ExitGuard(lambda status: monitor_finish(status))
    >>> guard.install()     # at on_train_begin
    >>> guard.release()     # at on_train_end
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import weakref
from collections.abc import Callable
from typing import Any

_STATUS = {signal.SIGTERM: "terminated", signal.SIGINT: "interrupted"}
_ARMED: weakref.WeakSet[ExitGuard] = weakref.WeakSet()
_BEFORE_SIGNAL_DEATH: list[Callable[[], None]] = []


def before_signal_death(callback: Callable[[], None]) -> None:
    """Run `callback()` when a guard lets a signal end the process by its default action, after the fit's record
    is written: neither `atexit` nor finalizers run then (a scheduler's SIGTERM, a preemption)."""
    _BEFORE_SIGNAL_DEATH.append(callback)


class ExitGuard:
    """Calls `finish(status)` once when the process is told to stop or exits while a fit is running."""

    def __init__(self, finish: Callable[[str], None]) -> None:
        self._finish = finish
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()

    def install(self) -> None:
        self._pid = os.getpid()
        atexit.register(self._at_exit)
        if threading.current_thread() is threading.main_thread():
            for signum in _STATUS:
                previous = signal.getsignal(signum)
                if previous not in (signal.SIG_IGN, None):  # None: set outside Python, cannot be chained
                    self._previous[signum] = previous
                    signal.signal(signum, self._on_signal)
        _ARMED.add(self)

    def release(self) -> None:
        _ARMED.discard(self)
        atexit.unregister(self._at_exit)
        if threading.current_thread() is threading.main_thread():  # else the handlers stay, passing through
            for signum, previous in self._previous.items():
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, previous)
            self._previous = {}

    def _at_exit(self) -> None:
        if os.getpid() == self._pid:
            self._finish("aborted")

    def _on_signal(self, signum: int, frame: Any) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        if os.getpid() == self._pid:
            self._finish(_STATUS[signum])  # releases this guard, restoring `previous`
        else:  # a child that inherited the handler: behave as if rnnmon were not there
            signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            for callback in _BEFORE_SIGNAL_DEATH:
                with contextlib.suppress(Exception):
                    callback()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


def _disarm_in_child() -> None:
    """In a forked child: nothing of the parent's fit may run here, so every guard steps aside."""
    for guard in list(_ARMED):
        try:
            guard.release()
        except (ValueError, OSError):  # not allowed to touch signals from this thread
            atexit.unregister(guard._at_exit)


os.register_at_fork(after_in_child=_disarm_in_child)
