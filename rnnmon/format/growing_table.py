"""A float64 table of a run's rows that grows by whole chunks, kept in event-step order, for `reader.RunReader`.

Example:
    >>> table = GrowingTable(width=3)
    >>> table.extend([20, 10], np.ones((5, 3)), [2, 3])   # two chunks, at event steps 20 and 10: rows reordered
    >>> table.view().shape
    (5, 3)
"""

from __future__ import annotations

import bisect

import numpy as np


class GrowingTable:
    """A float64 table that grows by whole chunks, kept in event-step order."""

    def __init__(self, width: int) -> None:
        self._rows = np.empty((0, width))
        self._size = 0
        self._steps: list[int] = []  # each chunk's event step, ascending
        self._starts: list[int] = []  # each chunk's first row
        self.inserted = 0  # merges that put chunks before rows already there (rows then moved): views of it are stale

    def extend(self, steps: list[int], rows: np.ndarray, counts: list[int]) -> None:
        """Add chunks (`counts[i]` rows at event step `steps[i]`, in any order) held in one array.

        Chunks that follow the rows already there are appended in place. Chunks that land before some of them (a
        second writer's file, read after the first's) are merged with those rows in one sort, into a new array,
        so one update costs its rows plus the rows it passes, never a rebuild per chunk.
        """
        if not steps:
            return
        if steps != sorted(steps):
            steps, rows, counts = _in_step_order(steps, rows, counts)
        at = bisect.bisect(self._steps, steps[0])  # the first chunk already there that the new ones precede
        moved = at < len(self._steps)
        if moved:  # merge the new chunks with those they precede
            first = self._starts[at]
            kept = self._steps[at:]
            kept_counts = np.diff([*self._starts[at:], self._size]).tolist()
            steps, rows, counts = _in_step_order(kept + steps, np.concatenate([self._rows[first:self._size], rows]),
                                                 kept_counts + counts)
            del self._steps[at:], self._starts[at:]
            self._size = first
            self.inserted += 1
        if self._size == 0:  # a first read: keep the array as it is
            self._rows = rows
        else:
            if moved or self._size + len(rows) > len(self._rows):  # moved: views handed out keep the rows they saw
                capacity = self._size + len(rows)
                grown = np.empty((capacity if moved else max(2 * len(self._rows), capacity, 256), self._rows.shape[1]))
                grown[: self._size] = self._rows[: self._size]
                self._rows = grown
            self._rows[self._size: self._size + len(rows)] = rows
        self._starts += (self._size + np.cumsum([0, *counts[:-1]])).tolist()
        self._steps += steps
        self._size += len(rows)

    def view(self) -> np.ndarray:
        return self._rows[: self._size]


def _in_step_order(steps: list[int], rows: np.ndarray, counts: list[int]) -> tuple[list[int], np.ndarray, list[int]]:
    """The chunks sorted by event step (stable: chunks of one step keep their order), rows moved with them."""
    order = np.argsort(np.asarray(steps, dtype=np.int64), kind="stable")
    sizes = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    moved = sizes[order]
    index = np.repeat(starts[order] - (np.cumsum(moved) - moved), moved) + np.arange(int(moved.sum()))
    return [steps[i] for i in order], rows[index], moved.tolist()
