"""Reading runs before the tab asks for them: one background thread, each run offered at most once.

`/runs` offers the runs it lists that nobody has read yet; the thread reads them one at a time, in the order
offered, through the plugin's own cache (and its per-run lock, so a request for a run being read waits for that
read instead of starting a second one). `offer` only queues: it never waits for a read.

Example:
    >>> ahead = ReadAhead()
    >>> ahead.offer(("", "exp1/rnnmon"), lambda: plugin.read_ahead_run(ctx, "", "exp1/rnnmon"))
    >>> ahead.done                                 # runs read ahead so far
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Hashable

LOG = logging.getLogger(__name__)


class ReadAhead:
    """A queue of reads and the one daemon thread that runs them; a key is accepted once per process."""

    def __init__(self) -> None:
        self._queue: collections.deque[Callable[[], bool]] = collections.deque()
        self._offered: set[Hashable] = set()
        self._lock = threading.Lock()
        self._running = False
        self.done = 0  # reads that returned True (the run was read and indexed)

    def offer(self, key: Hashable, read: Callable[[], bool]) -> None:
        """Queue `read` unless `key` was offered before; starts the thread when it is not running."""
        with self._lock:
            if key in self._offered:
                return
            self._offered.add(key)
            self._queue.append(read)
            if not self._running:
                self._running = True
                threading.Thread(target=self._work, name="rnnmon-read-ahead", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._running = False
                    return
                read = self._queue.popleft()
            try:
                if read():
                    self.done += 1
            except Exception:  # a read ahead must never take TensorBoard down; the route reports the run's error
                LOG.exception("rnnmon: reading a run ahead failed")
