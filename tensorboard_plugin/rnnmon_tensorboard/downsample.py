"""Cutting long series and interval lists down to what a chart of a few thousand pixels can show.

- `minmax_indices`: per time bucket, the rows holding each column's minimum and maximum, so a one-sample dip or
  spike survives any zoom level; nothing is averaged.
- `MinMaxPyramid`: the same answer for a sorted series of any length in about a millisecond. It keeps, per column,
  the row of the minimum and of the maximum of every block of 8, 64, 512, ... rows, built once per series; a query
  takes the coarsest level that still has several blocks per bucket, plus the raw rows at the window's ragged
  edges, and runs `minmax_indices` over those candidates. Every block's extremes are candidates, so every row that
  is a bucket's extreme is still found.
- `bin_intervals` / `IntervalCoverage`: for many intervals, the share of each time bucket they cover, per group.
  `IntervalCoverage` answers from prefix sums of sorted starts and ends (covered time before `t` is
  `t * (starts before t - ends before t) - (sum of those starts - sum of those ends)`), so a query costs
  O(buckets * log n) whatever the number of intervals.

Example:
    >>> pyramid = MinMaxPyramid(time_s, np.column_stack([wait_ms, compute_ms]))
    >>> rows = pyramid.indices(first, last, points=1280, lo=0.0, hi=3600.0)   # rows of [first, last)
"""

from __future__ import annotations

import numpy as np

FAN = 8  # rows per block at the first level, blocks per block above it
BLOCKS_PER_BUCKET = 8  # a query uses the coarsest level with at least this many blocks per bucket


def minmax_indices(x: np.ndarray, values: np.ndarray, points: int, lo: float, hi: float) -> np.ndarray:
    """Rows to keep so that each time bucket keeps its minimum and maximum of every column.

    `x` is sorted; `values` is [n, k] (or [n]). Rows whose columns are all NaN are dropped. With `n <= points`
    every row is kept; otherwise there are `points // (2k)` buckets over [lo, hi], so at most `points` rows come back.
    """
    values = values[:, None] if values.ndim == 1 else values  # reshape(len(x), -1) fails on 0 rows
    valid = ~np.isnan(values)
    if len(x) <= points:
        return np.flatnonzero(valid.any(axis=1))
    buckets = _buckets(points, values.shape[1])
    return _bucket_extremes(x, values, [np.flatnonzero(ok) for ok in valid.T], buckets, lo, hi)


def _buckets(points: int, columns: int) -> int:
    return max(1, points // (2 * columns))


def _bucket_extremes(x: np.ndarray, values: np.ndarray, candidates: list[np.ndarray], buckets: int, lo: float,
                     hi: float) -> np.ndarray:
    """Among each column's candidate rows (non-NaN), the minimum and maximum row of every bucket, sorted."""
    width = (hi - lo) / buckets if hi > lo else 1.0
    keep = []
    for column, rows in zip(values.T, candidates):
        if not len(rows):
            continue
        rows = np.sort(rows)  # time order: each bucket is one run of rows
        bucket = np.clip(((x[rows] - lo) / width).astype(np.int64), 0, buckets - 1)
        starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
        counts = np.diff(np.r_[starts, len(rows)])
        value = column[rows]
        for reduce in (np.minimum, np.maximum):
            hit = np.flatnonzero(value == np.repeat(reduce.reduceat(value, starts), counts))
            run = np.searchsorted(starts, hit, side="right")
            keep.append(rows[hit[np.r_[True, run[1:] != run[:-1]]]])  # the first extreme row of each bucket
    return sorted_unique(np.concatenate(keep)) if keep else np.empty(0, dtype=np.int64)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique` of a 1-d array, without its first call's import of numpy.ma (0.02-0.03 s of a cold view)."""
    values = np.sort(values)
    return values[np.r_[True, values[1:] != values[:-1]]] if len(values) else values


class MinMaxPyramid:
    """Per column, the row of the minimum and maximum of every block of FAN**level rows, for a sorted series."""

    def __init__(self, x: np.ndarray, values: np.ndarray,
                 reduced: list[tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.x = x
        self.values = values[:, None] if values.ndim == 1 else values
        self.levels: list[tuple[np.ndarray, np.ndarray]] = []  # (argmin rows, argmax rows), each [blocks, k]
        self._row_type = np.int32 if len(x) < 2**31 else np.int64  # row numbers: 4 bytes each where they fit
        low = high = None
        while len(self.x if low is None else low) >= FAN * BLOCKS_PER_BUCKET:
            # blocks already reduced (`reduced`: the levels of a prefix of these rows) are kept as they are
            done_low, done_high = reduced[len(self.levels)] if reduced and len(reduced) > len(self.levels) else (
                np.empty((0, self.values.shape[1]), dtype=self._row_type),) * 2
            low = np.concatenate([done_low, self._reduce(low, lowest=True, first=len(done_low))])
            high = np.concatenate([done_high, self._reduce(high, lowest=False, first=len(done_high))])
            self.levels.append((low, high))

    def appended(self, x: np.ndarray, values: np.ndarray) -> MinMaxPyramid | None:
        """A new pyramid of these rows followed by `x` (sorted, from `self.x[-1]` on) and `values`; only the
        blocks the new rows complete are reduced. The same arrays as building it from all rows at once.
        None when `x` begins before the last row: build anew."""
        if len(self.x) and len(x) and x[0] < self.x[-1]:
            return None
        values = values[:, None] if values.ndim == 1 else values
        values = np.concatenate([self.values, values.astype(self.values.dtype)])
        return MinMaxPyramid(np.concatenate([self.x, x]), values, self.levels)

    def _reduce(self, rows: np.ndarray | None, lowest: bool, first: int = 0) -> np.ndarray:
        """The row of each column's extreme over each full block of FAN rows of `rows` (all rows when None),
        from block `first` on; -1 where a block is all NaN."""
        k = self.values.shape[1]
        fill = np.inf if lowest else -np.inf
        if rows is None:  # the first level: blocks of the series itself, no gather needed
            blocks = len(self.x) // FAN - first
            picked = self.values[first * FAN: (first + blocks) * FAN].reshape(blocks, FAN, k)
            rows_of = np.arange(first * FAN, (first + blocks) * FAN, dtype=self._row_type).reshape(blocks, FAN, 1)
        else:
            blocks = len(rows) // FAN - first
            rows_of = rows[first * FAN: (first + blocks) * FAN].reshape(blocks, FAN, k)
            picked = np.where(rows_of >= 0, self.values[np.maximum(rows_of, 0), np.arange(k)], np.nan)
        picked = np.where(np.isnan(picked), fill, picked)
        choice = (np.argmin if lowest else np.argmax)(picked, axis=1)[:, None, :]
        best = np.take_along_axis(np.broadcast_to(rows_of, picked.shape), choice, axis=1)[:, 0, :]
        return np.where(np.take_along_axis(picked, choice, axis=1)[:, 0, :] == fill, -1, best).astype(self._row_type)

    def indices(self, first: int, last: int, points: int, lo: float, hi: float) -> np.ndarray:
        """`minmax_indices` of rows [first, last) (absolute row numbers, sorted), from a few thousand candidates.

        The rows of [first, last) are split into the largest blocks that lie within one time bucket (a block is
        taken at a level when its parent straddles a bucket edge), plus raw rows next to the edges; the
        extremes of those blocks and rows are every bucket's extremes.
        """
        k = self.values.shape[1]
        count = last - first
        buckets = _buckets(points, k)
        top = 0
        while top < len(self.levels) and count // FAN ** (top + 1) >= BLOCKS_PER_BUCKET * buckets:
            top += 1
        if count <= points or top == 0:
            return first + minmax_indices(self.x[first:last], self.values[first:last], points, lo, hi)
        width = (hi - lo) / buckets if hi > lo else 1.0

        def bucket_of(rows: np.ndarray) -> np.ndarray:
            return np.clip(((self.x[rows] - lo) / width).astype(np.int64), 0, buckets - 1)

        picks: list[np.ndarray] = []
        straddling, above = None, (0, 0)  # blocks of the level above that cross a bucket edge; that level's range
        for level in range(top, 0, -1):
            size = FAN ** level
            low, high = self.levels[level - 1]
            span = (-(-first // size), max(-(-first // size), min(last // size, len(low))))
            blocks = np.arange(*span)
            if straddling is not None:  # only the children of straddling blocks, and the edges the level above missed
                children = (straddling[:, None] * FAN + np.arange(FAN)).ravel()
                blocks = np.r_[np.arange(span[0], min(span[1], above[0] * FAN)), children,
                               np.arange(max(span[0], above[1] * FAN), span[1])]
            inside = bucket_of(blocks * size) == bucket_of((blocks + 1) * size - 1)
            picks += [low[blocks[inside]], high[blocks[inside]]]
            straddling, above = blocks[~inside], span
        raw = np.r_[np.arange(first, min(last, above[0] * FAN)), (straddling[:, None] * FAN + np.arange(FAN)).ravel(),
                    np.arange(max(first, above[1] * FAN), last)]
        blocks_rows = np.concatenate(picks) if picks else np.empty((0, k), dtype=np.int64)
        candidates = []
        for column in range(k):
            rows = np.r_[blocks_rows[:, column], raw]
            rows = rows[rows >= 0]
            candidates.append(rows[~np.isnan(self.values[rows, column])])
        return _bucket_extremes(self.x, self.values, candidates, buckets, lo, hi)


def bin_intervals(start: np.ndarray, end: np.ndarray, group: np.ndarray, lo: float, hi: float,
                  buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per bucket of [lo, hi] and group: the share of the bucket the group's intervals cover (capped at 1).

    Returns (bucket start, bucket end, group, share) for every pair with a share above 0, by bucket.
    """
    return IntervalCoverage(start, end, group).bins(lo, hi, buckets)


class IntervalCoverage:
    """Covered time per group before any instant, from prefix sums: binned shares for any window at once."""

    def __init__(self, start: np.ndarray, end: np.ndarray, group: np.ndarray) -> None:
        self.groups = sorted_unique(group)  # a handful of (device, cause) pairs
        self._starts, self._ends = [], []
        for value in self.groups:
            mine = group == value if len(self.groups) > 1 else slice(None)
            starts, ends = _sorted(start[mine]), _sorted(end[mine])
            self._starts.append((starts, np.r_[0.0, np.cumsum(starts)]))
            self._ends.append((ends, np.r_[0.0, np.cumsum(ends)]))

    def appended(self, start: np.ndarray, end: np.ndarray, group: np.ndarray) -> IntervalCoverage:
        """A new coverage of these intervals and the given ones (in any order): merged into the sorted starts
        and ends, prefix sums recomputed; the same arrays as building it from all intervals at once."""
        out = IntervalCoverage(np.empty(0), np.empty(0), np.empty(0, dtype=self.groups.dtype))
        out.groups = sorted_unique(np.concatenate([self.groups, group]))
        for value in out.groups:
            mine, known = group == value, np.flatnonzero(self.groups == value)
            starts, ends = (self._starts[known[0]][0], self._ends[known[0]][0]) if len(known) else (np.empty(0),) * 2
            starts, ends = _merged(starts, start[mine]), _merged(ends, end[mine])
            out._starts.append((starts, np.r_[0.0, np.cumsum(starts)]))
            out._ends.append((ends, np.r_[0.0, np.cumsum(ends)]))
        return out

    def ended_before(self, t: float) -> int:
        """How many intervals end before `t`."""
        return sum(int(np.searchsorted(ends, t, side="left")) for ends, _ in self._ends)

    def covered_before(self, index: int, t: np.ndarray) -> np.ndarray:
        """Total time the intervals of group `index` cover before each of `t`."""
        (starts, start_sums), (ends, end_sums) = self._starts[index], self._ends[index]
        began, ended = np.searchsorted(starts, t, side="right"), np.searchsorted(ends, t, side="right")
        return t * (began - ended) - (start_sums[began] - end_sums[ended])

    def bins(self, lo: float, hi: float, buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(bucket start, bucket end, group, share) for every bucket and group with a share above 0, by bucket."""
        width = (hi - lo) / buckets
        edges = lo + np.arange(buckets + 1) * width
        share = np.zeros((len(self.groups), buckets))
        for index in range(len(self.groups)):
            share[index] = np.minimum(np.diff(self.covered_before(index, edges)) / width, 1.0)
        bucket, which = np.nonzero(share.T > 1e-12)
        return edges[bucket], edges[bucket + 1], self.groups[which], share[which, bucket]


def _sorted(values: np.ndarray) -> np.ndarray:
    """`values` sorted; as they are when they already are (one writer's intervals nearly always)."""
    return values if np.all(values[1:] >= values[:-1]) else np.sort(values)


def _merged(sorted_values: np.ndarray, new: np.ndarray) -> np.ndarray:
    """`sorted_values` with `new` merged in, sorted (the common case, all new values last: one concatenation)."""
    new = np.sort(new)
    if not len(new) or not len(sorted_values) or new[0] >= sorted_values[-1]:
        return np.concatenate([sorted_values, new])
    return np.insert(sorted_values, np.searchsorted(sorted_values, new, side="right"), new)
