"""`/timeline` answered from a run's reading index (`rnnmon.format.index`): the cost is the points shown.

`IndexedTimeline(run, run_dir, gpus).view(start, end, points)` answers as `TimelineIndex.view` does, reading:
- a window whose chunks hold at most `RAW_ROWS` rows of a series (in at most `RAW_CHUNKS` chunks, steps
  `RAW_STEP_CHUNKS`): those chunks
  from the event file, each checked against the index, then min/max bucketing as for a whole run: exact;
- a longer one: the coarsest pyramid level with at least `RECORDS_PER_BUCKET` records per bucket (finer levels
  past its last record, and the rows not in a record yet), whose extreme rows are the candidates of min/max
  bucketing. Every candidate is a real row at its real time; a bucket's extreme is missed only where it sits, not
  being its record's extreme, in a record that straddles the bucket's edge (then that record's own extremes are
  drawn, at their times, in the bucket beside it), so a one-sample spike or dip is drawn at every zoom. `total` is
  then the rows of the records read;
- intervals (idle gaps, phases): listed one by one while their chunks hold at most `limit`, else binned: the
  covered seconds of each coverage record spread evenly over its span (exact for the rows not in a record yet).

Example:
    >>> timeline = IndexedTimeline("exp1/rnnmon", "runs/exp1/rnnmon")
    >>> timeline.refresh()
    >>> timeline.view(None, None, 1280)["steps"]["total"]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rnnmon.format import schema
from rnnmon.format.index import series_of
from rnnmon.format.index_located import IndexMismatch
from rnnmon.format.index_query import RunIndex

from .downsample import IntervalCoverage, minmax_indices

RAW_ROWS = 65536  # rows of a series read straight from its chunks for one window
RAW_CHUNKS = 64  # chunks read for one series and window at most
RAW_STEP_CHUNKS = 256  # for steps, whose level-0 records are 4 times longer (index.STEPS_BLOCK)
RECORDS_PER_BUCKET = 1  # a point series' level: the coarsest with at least this many records per bucket (1 to 16)
COVERAGE_PER_BUCKET = 4  # an interval group's level: the same, for coverage records (spread over their span)
PHASE_LIMIT = 100
RETRIES = 3  # a window read again after the index disagreed with the data (each time without that index)


class IndexedTimeline:
    """A run's timeline served from its index; `refresh()` takes in what was written since."""

    def __init__(self, run: str, run_dir: str) -> None:
        self.run = run
        self.index = RunIndex(run_dir)

    def refresh(self) -> None:
        self.index.refresh()

    @property
    def notes(self) -> list[str]:
        return self.index.notes

    @property
    def errors(self) -> list[str]:
        return self.index.errors

    def nbytes(self) -> int:
        return self.index.nbytes()

    def view(self, start: float | None, end: float | None, points: int) -> dict[str, Any]:
        """The `/timeline` answer over [start, end] (seconds since the origin; None: the run's edge)."""
        for attempt in range(RETRIES):
            try:
                return self._view(start, end, points)
            except IndexMismatch:  # the file's index is set aside (a note says so): read again without it
                if attempt == RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _view(self, start: float | None, end: float | None, points: int) -> dict[str, Any]:
        origin, last = self.index.extent()
        lo = 0.0 if start is None else start
        hi = max(last - origin, lo) if end is None else end
        window = (lo + origin, hi + origin, origin)
        gpus = sorted({int(name[len(prefix):]) for prefix in ("util", "sm") for name in self.index.series(prefix)})
        phases = self._intervals("phases.", window, PHASE_LIMIT, "kind", schema.PHASE_KINDS)
        del phases["device"]  # phases belong to the whole process
        return {
            "run": self.run,
            "origin": origin,
            "extent": {"start": 0.0, "end": round(last - origin, 4)},
            "range": {"start": round(lo, 4), "end": round(hi, 4)},
            "points": points,
            "steps": self._steps(window, points),
            "gpus": [self._gpu(index, window, points) for index in gpus],
            "gaps": self._intervals("gaps.", window, max(1, points // 2), "cause", schema.GAP_CAUSES),
            "phases": phases,
            "notes": self.notes,
        }

    def _steps(self, window: tuple[float, float, float], points: int) -> dict[str, Any]:
        total, downsampled, time, key, values = self._points("steps", window, points)
        wait, compute, gap = (values[:, c].astype(np.float64) for c in range(3))
        return {"total": total, "downsampled": downsampled, "step": key.astype(np.int64).tolist(),
                "time": _list(time - window[2], 4), "duration_ms": _list(compute + np.nan_to_num(wait), 3),
                "input_wait_ms": _list(wait, 3), "compute_ms": _list(compute, 3), "host_gap_ms": _list(gap, 3)}

    def _gpu(self, index: int, window: tuple[float, float, float], points: int) -> dict[str, Any]:
        described = self.index.devices.get(index, {})
        out: dict[str, Any] = {"index": index, "name": str(described.get("name", f"GPU {index}")),
                               "utilization": str(described.get("utilization", "nvml"))}
        for series, field in ((f"util{index}", "util"), (f"sm{index}", "sm_activity")):
            total, downsampled, time, _, values = self._points(series, window, points)
            out[field] = {"total": total, "downsampled": downsampled, "time": _list(time - window[2], 4),
                          "value": _list(values[:, 0], 2)}
        if not out["sm_activity"]["total"]:
            out["sm_activity"] = None
        return out

    def _points(self, series: str, window: tuple[float, float, float], points: int
                ) -> tuple[int, bool, np.ndarray, np.ndarray, np.ndarray]:
        """(rows in the window, whether thinned, and the rows drawn: time, key, values) of a point series."""
        lo, hi, _ = window
        columns = 3 if series == "steps" else 1
        rows, found = self.index.chunks(series, lo, hi, RAW_STEP_CHUNKS if series == "steps" else RAW_CHUNKS)
        if 0 <= rows <= RAW_ROWS:
            parts = [p for rows in self.index.read(found, _tag(series)) for name, p in series_of(_tag(series), rows)
                     if name == series]
            records: list[np.ndarray] = []
        else:
            records, parts = self.index.records(series, lo, hi, RECORDS_PER_BUCKET * max(1, points // (2 * columns)))
        time = np.concatenate([np.empty(0), *(p[0] for p in parts), *(r["time"].ravel() for r in records)])
        key = np.concatenate([np.empty(0), *(p[1] for p in parts), *(r["key"].ravel() for r in records)])
        values = np.concatenate([np.empty((0, columns), dtype=np.float32), *(p[2] for p in parts),
                                 *(r["values"].reshape(-1, columns) for r in records)])
        order = np.lexsort((key, time))
        time, key, values = time[order], key[order], values[order]
        if series == "steps":  # a step begun before the window is in it while it still runs
            inside = (time <= hi) & (time + (values[:, 1] + np.nan_to_num(values[:, 0])) / 1e3 >= lo)
        else:  # one sample on each side, where read, so that lines reach the edges of the view
            first = max(0, int(np.searchsorted(time, lo, side="left")) - 1)
            last = min(len(time), int(np.searchsorted(time, hi, side="right")) + 1)
            inside = np.zeros(len(time), dtype=bool)
            inside[first:last] = True
        inside &= ~np.isnan(time)
        time, key, values = time[inside], key[inside], values[inside]
        if len(time):  # a row that is the extreme of several columns or levels comes once
            fresh = np.r_[True, (time[1:] != time[:-1]) | (key[1:] != key[:-1])]
            time, key, values = time[fresh], key[fresh], values[fresh]
        total = len(time) if not records else int(sum(int(r["rows"].sum()) for r in records)) + sum(
            int(((p[0] >= lo) & (p[0] <= hi)).sum()) for p in parts)
        keep = minmax_indices(time, values, points, lo, hi)
        return total, bool(records) or len(keep) < total, time[keep], key[keep], values[keep]

    def _intervals(self, prefix: str, window: tuple[float, float, float], limit: int, label: str,
                   names: tuple[str, ...]) -> dict[str, Any]:
        lo, hi, origin = window
        groups = self.index.series(prefix)
        listed: dict[tuple[str, int], tuple[Any, Any]] = {}
        count = 0
        for group in groups:
            rows, found = self.index.chunks(group, lo, hi, limit)
            count = count + rows if rows >= 0 else limit + 1
            for fi, entry in found:
                listed.setdefault((fi.path, int(entry["offset"])), (fi, entry, group))
        if count <= limit or hi <= lo:
            return self._listed(list(listed.values()), prefix, window, label, names)
        width = (hi - lo) / limit
        edges = lo + np.arange(limit + 1) * width
        starts, ends, kinds, shares, total = [], [], [], [], 0
        for group in groups:
            rows, found = self.index.chunks(group, lo, hi, RAW_CHUNKS)
            if 0 <= rows <= RAW_ROWS:  # a sparse group: exact, from its chunks
                records, rests = [], [p for rows in self.index.read(found, _table_tag(group))
                                      for name, p in series_of(_table_tag(group), rows) if name == group]
            else:
                records, rests = self.index.records(group, lo, hi, COVERAGE_PER_BUCKET * limit)
            covered = np.zeros(limit + 1)
            for chosen in records:
                covered += _spread(chosen, edges)
                total += int(chosen["rows"].sum())
            for start, end in rests:
                if len(start):
                    coverage = IntervalCoverage(start, end, np.zeros(len(start), dtype=np.int32))
                    covered += coverage.covered_before(0, edges)
                    total += int(((end >= lo) & (start <= hi)).sum())
            share = np.minimum(np.diff(covered) / width, 1.0)
            bucket = np.flatnonzero(share > 1e-12)
            starts.append(edges[bucket])
            ends.append(edges[bucket + 1])
            shares.append(share[bucket])
            kinds.append(np.full(len(bucket), _group_code(group, len(names))))
        start, end, share, code = (np.concatenate([np.empty(0), *x]) for x in (starts, ends, shares, kinds))
        order = np.argsort(start, kind="stable")
        return _interval_answer(total, True, start[order] - origin, end[order] - origin, share[order],
                                code[order].astype(np.int64), label, names)

    def _listed(self, found: list[tuple[Any, Any, str]], prefix: str, window: tuple[float, float, float],
                label: str, names: tuple[str, ...]) -> dict[str, Any]:
        lo, hi, origin = window
        rows = self.index.read([(fi, entry) for fi, entry, _ in found], _table_tag(prefix))
        table = np.concatenate(rows) if rows else np.empty((0, 4))
        if prefix == "phases.":  # [kind, start, end] as intervals [device, start, end, kind] of the process
            table = np.column_stack([np.full(len(table), schema.STEP_DEVICE), table[:, 1:3], table[:, 0]])
        table = table[(table[:, 2] >= lo) & (table[:, 1] <= hi)]
        table = table[np.argsort(table[:, 1], kind="stable")]
        code = ((table[:, 0] + 1) * len(names) + table[:, 3]).astype(np.int64)
        return _interval_answer(len(table), False, table[:, 1] - origin, table[:, 2] - origin, np.ones(len(table)),
                                code, label, names)


def _spread(records: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Covered seconds before each edge, each record's covered seconds spread evenly over [first start, last end]:
    a piecewise-linear function of time, integrated once over the records' sorted ends (O(n log n))."""
    first, last, covered = records["t_first"], records["t_last"], records["covered"]
    span = last - first
    flat = span > 0
    rate = np.where(flat, covered / np.where(flat, span, 1.0), 0.0)
    at = np.concatenate([first, last])
    order = np.argsort(at, kind="stable")
    at, change = at[order], np.concatenate([rate, -rate])[order]
    slope = np.cumsum(change)  # the covered seconds per second after each breakpoint
    before = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(at))])
    i = np.searchsorted(at, edges, side="right") - 1
    j = np.maximum(i, 0)
    out = np.where(i < 0, 0.0, before[j] + slope[j] * (edges - at[j]))
    points = np.sort(first[~flat])  # records of one instant: all their time at it
    sums = np.concatenate([[0.0], np.cumsum(covered[~flat][np.argsort(first[~flat], kind="stable")])])
    return out + sums[np.searchsorted(points, edges, side="right")]


def _group_code(group: str, kinds: int) -> int:
    """gaps.d<D>.c<C> and phases.k<K> as TimelineIndex numbers groups: (device + 1) * kinds + kind."""
    if group.startswith("phases.k"):
        return int(group[len("phases.k"):])
    device, cause = group[len("gaps.d"):].split(".c")
    return (int(device) + 1) * kinds + int(cause)


def _interval_answer(total: int, binned: bool, start: np.ndarray, end: np.ndarray, share: np.ndarray,
                     code: np.ndarray, label: str, names: tuple[str, ...]) -> dict[str, Any]:
    devices = code // len(names) - 1
    return {"total": total, "binned": binned, "start": _list(start, 4), "end": _list(end, 4),
            "share": _list(share, 3), label: [names[int(k) % len(names)] for k in code.tolist()],
            "device": [None if d == schema.STEP_DEVICE else int(d) for d in devices.tolist()]}


def _table_tag(group: str) -> str:
    return schema.PHASES_TAG if group.startswith("phases.") else schema.GAPS_TAG


def _tag(series: str) -> str:
    if series == "steps":
        return schema.STEPS_TAG
    return f"{schema.UTIL_TAG_PREFIX if series.startswith('util') else schema.STATS_TAG_PREFIX}" \
           f"{series[4:] if series.startswith('util') else series[2:]}"


def _list(values: np.ndarray, decimals: int) -> list[float | None]:
    return [None if math.isnan(v) else v for v in np.round(np.asarray(values, dtype=np.float64), decimals).tolist()]
