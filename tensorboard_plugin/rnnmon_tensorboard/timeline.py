"""One run's time series for a time range, cut down to about `points` points per series for the page.

`TimelineIndex(run)` sorts and indexes a run's tables once per version of its data; `view(start, end, points)`
then answers each `/timeline` request in milliseconds, whatever the run's length (see downsample.py):
- Series are thinned by min/max bucketing: the range is split into equal time buckets and each bucket keeps the
  rows holding the minimum and the maximum of every column, in time order. A one-sample dip or spike therefore
  survives any zoom level; nothing is averaged.
- Intervals (idle gaps, phases) come back one by one while they are few; beyond that they are binned: per time
  bucket and kind, the share of the bucket they cover, so a thousand short gaps at a coarse zoom read as
  "8% idle here", never as one solid band.

All times are seconds since the run's origin, its earliest rnnmon timestamp (Unix seconds in `origin`).

Example:
    >>> index = TimelineIndex(run_data)
    >>> timeline = index.view(start=None, end=None, points=1000)
    >>> timeline["steps"]["input_wait_ms"][:3]
    [12.1, 11.8, 0.4]
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from rnnmon.format import schema, series
from rnnmon.format.reader import RunData

from .downsample import IntervalCoverage, MinMaxPyramid, bin_intervals, minmax_indices

__all__ = ["TimelineIndex", "array_bytes", "bin_intervals", "build_timeline", "extent", "minmax_indices"]

_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
# The GPU series the tab draws, as declared (`Series.drawn`): (key in `/timeline`, RunData table, column).
_GPU_SERIES = (*((key, "util", column) for key, column in series.drawn(series.UTIL)),
               *((key, "stats", column) for key, column in series.drawn(series.STATS)))
PHASE_LIMIT = 100  # phases are drawn as shapes, which plotly draws one by one


def extent(run: RunData) -> tuple[float, float]:
    """(first, last) Unix time of anything the run recorded; (0, 0) when it recorded nothing."""
    firsts, lasts = [], []
    for times in (run.steps[:, _S["begin"]], run.steps[:, _S["end"]], run.phases[:, 1], run.phases[:, 2],
                  run.gaps[:, 1], run.gaps[:, 2], *(table[:, 0] for table in run.util.values())):
        if len(times):
            firsts.append(float(np.min(times)))
            lasts.append(float(np.max(times)))
    return (min(firsts), max(lasts)) if firsts else (0.0, 0.0)


def build_timeline(run: RunData, start: float | None, end: float | None, points: int) -> dict[str, Any]:
    """The `/timeline` answer for `run` over [start, end] (seconds since the origin; None: the run's edge)."""
    return TimelineIndex(run).view(start, end, points)


class TimelineIndex:
    """A run's steps, GPU series, gaps and phases, sorted relative to the origin and indexed for `view`.

    It keeps what the page needs, not the run's tables: about 28 bytes per step and 52 per gap.
    """

    def __init__(self, run: RunData) -> None:
        self.run = run.run
        self.notes = list(run.notes)  # read, but worth knowing: overlapping files, a cut through records
        self.origin, last = extent(run)
        self.end = last - self.origin
        self.rows = _row_counts(run)
        self.steps = _StepIndex(run.steps, self.origin)
        self.gpus = [_GpuIndex(run, index, self.origin) for index in sorted(set(run.util) | set(run.stats))]
        self.gaps = _IntervalIndex(run.gaps, self.origin, schema.GAP_CAUSES)
        self.phases = _IntervalIndex(_phase_intervals(run.phases), self.origin, schema.PHASE_KINDS)

    def appended(self, run: RunData) -> TimelineIndex | None:
        """A new index of `run`, whose tables are this index's tables with rows appended (a live run read
        again by the same `RunReader`); only the new rows are indexed. None where they cannot be appended
        (steps or samples earlier than the last indexed, anything before the origin, a new GPU): build anew.

        Example:
            >>> index = index.appended(reader.update_from_files(run_dir)) or TimelineIndex(reader.data())
        """
        rows = _row_counts(run)
        if rows == self.rows and run.notes == self.notes:
            return self
        if (set(rows) != set(self.rows) or any(rows[table] < count for table, count in self.rows.items())
                or not any(self.rows.values())):  # an empty index has no origin yet
            return None
        new = RunData(run.run, steps=run.steps[self.rows["steps"]:], phases=run.phases[self.rows["phases"]:],
                      gaps=run.gaps[self.rows["gaps"]:],
                      util={i: t[self.rows[f"util{i}"]:] for i, t in run.util.items()},
                      stats={i: t[self.rows[f"stats{i}"]:] for i, t in run.stats.items()}, devices=run.devices)
        first, last = extent(new)
        if first < self.origin:
            return None
        steps = self.steps.appended(new.steps, self.origin)
        gpus = [gpu.appended(new, self.origin) for gpu in self.gpus]
        if steps is None or None in gpus:
            return None
        out = copy.copy(self)
        out.end, out.rows, out.steps, out.gpus = max(self.end, last - self.origin), rows, steps, gpus
        out.notes = list(run.notes)
        out.gaps = self.gaps.appended(new.gaps, self.origin)
        out.phases = self.phases.appended(_phase_intervals(new.phases), self.origin)
        return out

    def view(self, start: float | None, end: float | None, points: int) -> dict[str, Any]:
        """The `/timeline` answer over [start, end] (seconds since the origin; None: the run's edge)."""
        lo = 0.0 if start is None else start
        hi = max(self.end, lo) if end is None else end
        phases = self.phases.view(lo, hi, PHASE_LIMIT, "kind")
        del phases["device"]  # phases belong to the whole process
        return {
            "run": self.run,
            "origin": self.origin,
            "extent": {"start": 0.0, "end": round(self.end, 4)},
            "range": {"start": round(lo, 4), "end": round(hi, 4)},
            "points": points,
            "steps": self.steps.view(lo, hi, points),
            "gpus": [gpu.view(lo, hi, points) for gpu in self.gpus],
            "gaps": self.gaps.view(lo, hi, max(1, points // 2), "cause"),
            "phases": phases,
            "notes": self.notes,
        }


class _StepIndex:
    """Steps after each fit's warm-up, by begin time: input wait, compute and host gap (ms) in a pyramid."""

    def __init__(self, steps: np.ndarray, origin: float) -> None:
        begin, number, values, self.longest_s = _step_columns(steps, origin)
        self.number = number.astype(np.int32 if not len(number) or number.max() < 2**31 else np.int64)
        self.pyramid = MinMaxPyramid(begin, values)

    def appended(self, steps: np.ndarray, origin: float) -> _StepIndex | None:
        """A new index with `steps` (rows after those indexed) added; None when one begins before the last."""
        begin, number, values, longest_s = _step_columns(steps, origin)
        pyramid = self.pyramid.appended(begin, values)
        if pyramid is None:
            return None
        out = copy.copy(self)
        out.longest_s, out.pyramid = max(self.longest_s, longest_s), pyramid
        wide = len(number) and number.max() >= 2**31
        out.number = np.concatenate([self.number, number.astype(np.int64 if wide else self.number.dtype)])
        return out

    def view(self, lo: float, hi: float, points: int) -> dict[str, Any]:
        begin = self.pyramid.x
        first = int(np.searchsorted(begin, lo - self.longest_s, side="left"))
        inside = int(np.searchsorted(begin, lo, side="left"))
        last = int(np.searchsorted(begin, hi, side="right"))
        head = np.arange(first, min(inside, last))  # begun before lo: inside the view while still running at lo
        reaches = np.flatnonzero(begin[head] + self._duration_s(head) >= lo)
        first = int(head[reaches[0]]) if len(reaches) else inside
        keep = self.pyramid.indices(first, last, points, lo, hi) if first < last else np.empty(0, dtype=np.int64)
        wait_ms, compute_ms, gap_ms = (self.pyramid.values[keep, column].astype(np.float64) for column in range(3))
        return {
            "total": max(0, last - first),
            "downsampled": len(keep) < max(0, last - first),
            "step": self.number[keep].tolist(),
            "time": _list(begin[keep], 4),
            "duration_ms": _list(compute_ms + np.nan_to_num(wait_ms), 3),
            "input_wait_ms": _list(wait_ms, 3),
            "compute_ms": _list(compute_ms, 3),
            "host_gap_ms": _list(gap_ms, 3),
        }

    def _duration_s(self, rows: np.ndarray) -> np.ndarray:
        values = self.pyramid.values[rows]
        return (values[:, 1].astype(np.float64) + np.nan_to_num(values[:, 0])) / 1e3


def _step_columns(steps: np.ndarray, origin: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(begin since the origin, step number, [input wait, compute, host gap] ms as float32, longest step in s) of
    the steps after each fit's warm-up, by begin time."""
    warmup = np.isnan(steps[:, _S["host_gap_ms"]])  # each fit's first step is its warm-up phase
    steps = _by_column(steps[~warmup], _S["begin"])
    duration_s = steps[:, _S["end"]] - steps[:, _S["begin"]]
    wait_ms = steps[:, _S["input_wait_ms"]]
    values = np.empty((len(steps), 3), dtype=np.float32)
    values[:, 0], values[:, 1] = wait_ms, 1e3 * duration_s - np.nan_to_num(wait_ms)
    values[:, 2] = steps[:, _S["host_gap_ms"]]
    return (steps[:, _S["begin"]] - origin, steps[:, _S["step"]], values,
            float(duration_s.max()) if len(steps) else 0.0)


class _GpuIndex:
    """One GPU's drawn series (`_GPU_SERIES`: utilization and, where the GPU has GPM, SM activity), each a pyramid
    over time."""

    def __init__(self, run: RunData, index: int, origin: float) -> None:
        self.index = index
        self.name = str(run.devices.get(index, {}).get("name", f"GPU {index}"))
        self.utilization = str(run.devices.get(index, {}).get("utilization", "nvml"))  # or "not reported on MIG"
        self.series = {key: _series_pyramid(*_samples(run, index, table, column, origin))
                       for key, table, column in _GPU_SERIES}

    def appended(self, new: RunData, origin: float) -> _GpuIndex | None:
        """A new index with this GPU's samples in `new` added; None when one comes before the last indexed."""
        out = copy.copy(self)
        out.series = {key: self.series[key].appended(*_measured(*_samples(new, self.index, table, column, origin)))
                      for key, table, column in _GPU_SERIES}
        return None if None in out.series.values() else out

    def view(self, lo: float, hi: float, points: int) -> dict[str, Any]:
        """Each drawn series by its key; the first (utilization) always, the others null where never measured."""
        drawn = {key: _series(pyramid, lo, hi, points) for key, pyramid in self.series.items()}
        first = _GPU_SERIES[0][0]
        return {"index": self.index, "name": self.name, "utilization": self.utilization,
                **{key: view if key == first or view["total"] else None for key, view in drawn.items()}}


def _samples(run: RunData, index: int, table: str, column: int, origin: float) -> tuple[np.ndarray, np.ndarray]:
    """(time since the origin, value) of one column of GPU `index`'s `table` ("util" or "stats") in `run`."""
    rows = getattr(run, table).get(index)
    if rows is None:
        return np.empty(0), np.empty(0)
    return rows[:, 0] - origin, rows[:, column]


def _series_pyramid(time: np.ndarray, value: np.ndarray) -> MinMaxPyramid:
    return MinMaxPyramid(*_measured(time, value))


def _measured(time: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples with a value, by time; values as float32."""
    order = np.argsort(time, kind="stable")
    time, value = time[order], value[order]
    measured = ~np.isnan(value)
    return time[measured], value[measured].astype(np.float32)


def _series(pyramid: MinMaxPyramid, lo: float, hi: float, points: int) -> dict[str, Any]:
    """Samples in [lo, hi], plus one on each side so lines reach the edges of the view."""
    first = max(0, int(np.searchsorted(pyramid.x, lo, side="left")) - 1)
    last = min(len(pyramid.x), int(np.searchsorted(pyramid.x, hi, side="right")) + 1)
    keep = pyramid.indices(first, last, points, lo, hi) if first < last else np.empty(0, dtype=np.int64)
    return {"total": max(0, last - first), "downsampled": len(keep) < last - first,
            "time": _list(pyramid.x[keep], 4), "value": _list(pyramid.values[keep, 0], 2)}


class _IntervalIndex:
    """Intervals [device, start, end, kind] by start, with their coverage per (device, kind) for binning."""

    def __init__(self, table: np.ndarray, origin: float, names: tuple[str, ...]) -> None:
        self.names = names
        self.start, self.end, self.group = self._columns(table, origin)
        self.longest_s = float((self.end - self.start).max()) if len(self.start) else 0.0
        self.coverage = IntervalCoverage(self.start, self.end, self.group)

    def _columns(self, table: np.ndarray, origin: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, end, group) of the intervals by start; the group numbers (device, kind), device -1 as 0."""
        table = _by_column(table, 1)
        group = ((table[:, 0] + 1) * len(self.names) + table[:, 3]).astype(np.int32)
        return table[:, 1] - origin, table[:, 2] - origin, group

    def appended(self, table: np.ndarray, origin: float) -> _IntervalIndex:
        """A new index with the intervals of `table` added, merged in by start (they may come in any order)."""
        if not len(table):
            return self
        start, end, group = self._columns(table, origin)
        out = copy.copy(self)
        at = np.searchsorted(self.start, start, side="right")  # after equal starts: as a stable sort of all rows
        out.start, out.end, out.group = (np.insert(old, at, new) for old, new in
                                         ((self.start, start), (self.end, end), (self.group, group)))
        out.longest_s = max(self.longest_s, float((end - start).max()))
        out.coverage = self.coverage.appended(start, end, group)
        return out

    def view(self, lo: float, hi: float, limit: int, label: str) -> dict[str, Any]:
        """Intervals overlapping [lo, hi]; binned into `limit` buckets when more than `limit` of them overlap.

        `share` is 1 for a single interval, the covered share for a bin.
        """
        began = int(np.searchsorted(self.start, hi, side="right"))
        total = began - self.coverage.ended_before(lo)  # started by hi, minus ended before lo
        binned = total > limit and hi > lo
        if binned:
            s, e, g, share = self.coverage.bins(lo, hi, limit)
        else:
            first = int(np.searchsorted(self.start, lo - self.longest_s, side="left"))
            rows = first + np.flatnonzero(self.end[first:began] >= lo)
            s, e, g, share = self.start[rows], self.end[rows], self.group[rows], np.ones(len(rows))
        devices = g // len(self.names) - 1
        return {
            "total": total,
            "binned": binned,
            "start": _list(s, 4),
            "end": _list(e, 4),
            "share": _list(share, 3),
            label: [self.names[int(k) % len(self.names)] for k in g],
            "device": [None if d == schema.STEP_DEVICE else int(d) for d in devices.tolist()],
        }


def _by_column(table: np.ndarray, column: int) -> np.ndarray:
    """`table`'s rows in order of `column` (a stable sort); as it is when they already are (one writer's rows)."""
    keys = table[:, column]
    return table if np.all(keys[1:] >= keys[:-1]) else table[np.argsort(keys, kind="stable")]


def _phase_intervals(phases: np.ndarray) -> np.ndarray:
    """Phases as intervals [device, start, end, kind] of the whole process."""
    return np.column_stack([np.full(len(phases), schema.STEP_DEVICE), phases[:, 1:3], phases[:, 0]])


def _row_counts(run: RunData) -> dict[str, int]:
    """Rows per table of `run`: what an index has indexed."""
    counts = {"steps": len(run.steps), "phases": len(run.phases), "gaps": len(run.gaps)}
    counts.update({f"util{index}": len(table) for index, table in run.util.items()})
    counts.update({f"stats{index}": len(table) for index, table in run.stats.items()})
    return counts


def array_bytes(obj: Any) -> int:
    """Bytes held in numpy arrays by `obj` and its attributes, lists, tuples and dicts: a cache's measure."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, (list, tuple)):
        return sum(array_bytes(value) for value in obj)
    if isinstance(obj, dict):
        return sum(array_bytes(value) for value in obj.values())
    return sum(array_bytes(value) for value in vars(obj).values()) if hasattr(obj, "__dict__") else 0


def _list(values: np.ndarray, decimals: int) -> list[float | None]:
    """JSON-ready floats; NaN (not measured) becomes null."""
    return [None if math.isnan(v) else v for v in np.round(np.asarray(values, dtype=np.float64), decimals).tolist()]
