"""The user's `on_alert` hook, called on a daemon thread of its own so that a slow hook never holds up the record.

The writer thread hands each event over without waiting. At most `max_pending` events wait for the hook; later
ones are dropped and counted until it catches up (they are still logged and recorded). At the end of a fit the
caller waits a bounded time for the events already handed over, after the record is on disk; a hook that is
still busy then is named in one ERROR and left to finish in the background.

Example:
    >>> hooks = HookThread(on_alert)
    >>> hooks.submit(event)       # on the writer thread: returns at once
    >>> hooks.close()             # no more events
    >>> hooks.join(3.0)           # at the end of the fit: True once every event was delivered
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from rnnmon.alerts.rules import AlertEvent

LOG = logging.getLogger("rnnmon")
MAX_PENDING = 100  # events waiting for the hook; more are dropped and counted


class HookThread:
    """Delivers alert events to `hook` in order, on a daemon thread started with the first event."""

    def __init__(self, hook: Callable[[AlertEvent], None], *, max_pending: int = MAX_PENDING,
                 name: str = "rnnmon-hooks") -> None:
        self._hook = hook
        self._max_pending = max_pending
        self._queue: queue.SimpleQueue[AlertEvent | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = self._closed = self._off = False
        self._busy: tuple[AlertEvent, float] | None = None  # the event the hook is handling, since when
        self.dropped = 0

    @property
    def name(self) -> str:
        """The hook's qualified name, as the logs give it."""
        hook = self._hook
        qualname = getattr(hook, "__qualname__", None)
        return f"{getattr(hook, '__module__', None) or '?'}.{qualname}" if qualname else repr(hook)

    def submit(self, event: AlertEvent) -> None:
        """Hand `event` over without waiting; dropped (and counted) while `max_pending` events wait."""
        if self._closed or self._off:
            return
        if self._queue.qsize() >= self._max_pending:
            if not self.dropped:
                LOG.warning("rnnmon: the on_alert hook %s is slow (%s); %d alerts wait for it, and later ones are "
                            "not handed to it until it catches up (they are still logged and recorded).",
                            self.name, self._doing(), self._max_pending)
            self.dropped += 1
            return
        if not self._started:
            self._started = True
            self._thread.start()
        self._queue.put(event)

    def close(self) -> None:
        """No more events: the thread ends once it has delivered those handed over."""
        if self._closed:
            return
        self._closed = True
        if self.dropped:
            LOG.warning("rnnmon: %d alerts were not handed to the on_alert hook %s, which was busy; they are in the "
                        "log and the record.", self.dropped, self.name)
        if self._started:
            self._queue.put(None)

    def join(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every event handed over; True once delivered, else one ERROR naming the hook."""
        if not self._started:
            return True
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            return True
        LOG.error("rnnmon: the on_alert hook %s is slow (%s); the end of the fit waited %.0f s for it and goes on "
                  "(the record on disk is complete). Alerts still waiting for the hook are lost if the process "
                  "exits first.", self.name, self._doing(), timeout_s)
        return False

    def _doing(self) -> str:
        busy = self._busy
        if busy is None:
            return "between alerts"
        event, since = busy
        return f"on the {event.state} {event.rule} alert for {time.monotonic() - since:.1f} s"

    def _run(self) -> None:
        while (event := self._queue.get()) is not None:
            self._busy = (event, time.monotonic())
            try:
                self._hook(event)
            except (SystemExit, KeyboardInterrupt) as error:  # on rnnmon's thread: it cannot end the fit
                self._off = True
                LOG.error("rnnmon: the alert hook raised %s on %s; alert hooks are off for the rest of the fit "
                          "(recording goes on). Use stop_on_alert to end training on an alert.",
                          type(error).__name__, event.rule)
                return
            except Exception:
                LOG.exception("rnnmon: the alert hook %s failed on %s", self.name, event.rule)
            finally:
                self._busy = None
