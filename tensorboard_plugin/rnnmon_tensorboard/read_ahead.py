"""Reading runs before the tab asks for them: one background thread, each run offered at most once.

`/runs` offers the runs it lists that nobody has read yet; the thread reads them one at a time, in the order
offered, through the plugin's own cache (and its per-run lock, so a request for a run being read waits for that
read instead of starting a second one). `offer` only queues: it never waits for a read. `likely_runs` picks what
to offer: the run the tab shows first (the first listed), then the most recently written, as many as fit a
budget for their indexes, estimated from their event files' size.

Example:
    >>> ahead = ReadAhead()
    >>> ahead.offer(("", "exp1/rnnmon"), lambda: plugin.read_ahead_run(ctx, "", "exp1/rnnmon"))
    >>> ahead.done                                 # runs read ahead so far
    >>> likely_runs(runs_listed, {"exp1/rnnmon": 2**20}, most=3, budget=32 * 2**20)
    [('exp1/rnnmon', 5242880)]
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

LOG = logging.getLogger(__name__)
INDEX_BYTES_PER_FILE_BYTE = 5  # a 1M-step run: 4.6 (input-bound, a gap every step), 2.3 (GPU run)


def likely_runs(runs: list[dict[str, Any]], file_bytes: dict[str, int], most: int, budget: int
                ) -> list[tuple[str, int]]:
    """The runs (as /runs lists them) the tab is likely to open next, with their indexes' estimated bytes: the
    first listed, then the most recently written, at most `most`, while their estimates fit in `budget`."""
    likely = runs[:1] + sorted(runs[1:], key=lambda run: -run["last_write"])
    chosen = []
    for run in likely[:most]:
        estimate = file_bytes.get(run["run"], 0) * INDEX_BYTES_PER_FILE_BYTE
        if estimate > budget:
            break
        budget -= estimate
        chosen.append((run["run"], estimate))
    return chosen


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
