"""One run's time series for a time range, cut down to about `points` points per series for the page.

Series are thinned by min/max bucketing: the range is split into equal time buckets and each bucket keeps the
rows holding the minimum and the maximum of every column, in time order. A one-sample dip or spike therefore
survives any zoom level; nothing is averaged. Intervals (idle gaps, phases) come back one by one while they are
few; beyond that they are binned: per time bucket and kind, the share of the bucket they cover, so a thousand
short gaps at a coarse zoom read as "8% idle here", never as one solid band.

All times are seconds since the run's origin, its earliest rnnmon timestamp (Unix seconds in `origin`).

Example:
    >>> timeline = build_timeline(run_data, start=None, end=None, points=1000)
    >>> timeline["steps"]["input_wait_ms"][:3]
    [12.1, 11.8, 0.4]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rnnmon import metadata as md
from rnnmon.reader import RunData

_S = {name: i for i, name in enumerate(md.STEP_COLUMNS)}
_SM_ACTIVITY = md.STAT_COLUMNS.index("sm_activity_pct")
PHASE_LIMIT = 100  # phases are drawn as shapes, which plotly draws one by one


def minmax_indices(x: np.ndarray, values: np.ndarray, points: int, lo: float, hi: float) -> np.ndarray:
    """Rows to keep so that each time bucket keeps its minimum and maximum of every column.

    `x` is sorted; `values` is [n, k]. Rows whose columns are all NaN are dropped. With `n <= points` every row is
    kept; otherwise there are `points // (2k)` buckets over [lo, hi], so at most `points` rows come back.
    """
    values = values[:, None] if values.ndim == 1 else values  # reshape(len(x), -1) fails on 0 rows
    valid = ~np.isnan(values)
    if len(x) <= points:
        return np.flatnonzero(valid.any(axis=1))
    buckets = max(1, points // (2 * values.shape[1]))
    width = (hi - lo) / buckets if hi > lo else 1.0
    bucket = np.clip(((x - lo) / width).astype(np.int64), 0, buckets - 1)
    keep = []
    for column, ok in zip(values.T, valid.T):
        rows = np.flatnonzero(ok)
        if not len(rows):
            continue
        order = rows[np.lexsort((column[rows], bucket[rows]))]  # by bucket, then by value
        sorted_bucket = bucket[order]
        first = np.flatnonzero(np.r_[True, sorted_bucket[1:] != sorted_bucket[:-1]])
        last = np.r_[first[1:] - 1, len(order) - 1]
        keep += [order[first], order[last]]
    return np.unique(np.concatenate(keep)) if keep else np.empty(0, dtype=np.int64)


def bin_intervals(start: np.ndarray, end: np.ndarray, group: np.ndarray, lo: float, hi: float,
                  buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per bucket of [lo, hi] and group: the share of the bucket the group's intervals cover (capped at 1).

    Returns (bucket start, bucket end, group, share) for every pair with a share above 0, by bucket.
    """
    width = (hi - lo) / buckets
    s, e = np.clip(start, lo, hi), np.clip(end, lo, hi)
    first = np.clip(((s - lo) / width).astype(np.int64), 0, buckets - 1)
    last = np.clip(((e - lo) / width).astype(np.int64), 0, buckets - 1)
    groups, row = np.unique(group, return_inverse=True)
    covered = np.zeros((len(groups), buckets))
    single = first == last
    np.add.at(covered, (row[single], first[single]), (e - s)[single])
    for i in np.flatnonzero(~single):  # few: an interval wider than a bucket
        edges = lo + np.arange(first[i], last[i] + 2) * width
        covered[row[i], first[i]:last[i] + 1] += np.clip(np.minimum(edges[1:], e[i]) - np.maximum(edges[:-1], s[i]),
                                                          0, None)
    share = np.minimum(covered / width, 1.0)
    bucket, which = np.nonzero(share.T > 0)
    return lo + bucket * width, lo + (bucket + 1) * width, groups[which], share[which, bucket]


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
    origin, last = extent(run)
    lo = 0.0 if start is None else start
    hi = max(last - origin, lo) if end is None else end
    phase_table = np.column_stack([np.full(len(run.phases), md.STEP_DEVICE), run.phases[:, 1:3], run.phases[:, 0]])
    phases = _intervals(phase_table, md.PHASE_KINDS, "kind", origin, lo, hi, PHASE_LIMIT)
    del phases["device"]  # phases belong to the whole process
    return {
        "run": run.run,
        "origin": origin,
        "extent": {"start": 0.0, "end": round(last - origin, 4)},
        "range": {"start": round(lo, 4), "end": round(hi, 4)},
        "points": points,
        "steps": _steps(run.steps, origin, lo, hi, points),
        "gpus": [_gpu(run, index, origin, lo, hi, points) for index in sorted(run.util)],
        "gaps": _intervals(run.gaps, md.GAP_CAUSES, "cause", origin, lo, hi, max(1, points // 2)),
        "phases": phases,
    }


def _steps(steps: np.ndarray, origin: float, lo: float, hi: float, points: int) -> dict[str, Any]:
    steps = steps[~np.isnan(steps[:, _S["host_gap_ms"]])]  # each fit's first step is its warm-up phase
    steps = steps[np.argsort(steps[:, _S["begin"]], kind="stable")]
    begin, end = steps[:, _S["begin"]] - origin, steps[:, _S["end"]] - origin
    inside = (end >= lo) & (begin <= hi)
    steps, begin = steps[inside], begin[inside]
    duration_ms = 1e3 * (steps[:, _S["end"]] - steps[:, _S["begin"]])
    wait_ms = steps[:, _S["input_wait_ms"]]
    compute_ms = duration_ms - np.nan_to_num(wait_ms)
    gap_ms = steps[:, _S["host_gap_ms"]]
    keep = minmax_indices(begin, np.column_stack([wait_ms, compute_ms, gap_ms]), points, lo, hi)
    return {
        "total": len(steps),
        "downsampled": len(keep) < len(steps),
        "step": steps[keep, _S["step"]].astype(np.int64).tolist(),
        "time": _list(begin[keep], 4),
        "duration_ms": _list(duration_ms[keep], 3),
        "input_wait_ms": _list(wait_ms[keep], 3),
        "compute_ms": _list(compute_ms[keep], 3),
        "host_gap_ms": _list(gap_ms[keep], 3),
    }


def _gpu(run: RunData, index: int, origin: float, lo: float, hi: float, points: int) -> dict[str, Any]:
    device = run.devices.get(index, {})
    stats = run.stats.get(index, np.empty((0, len(md.STAT_COLUMNS))))
    sm = _series(stats[:, 0] - origin, stats[:, _SM_ACTIVITY], lo, hi, points)
    return {
        "index": index,
        "name": str(device.get("name", f"GPU {index}")),
        "util": _series(run.util[index][:, 0] - origin, run.util[index][:, 1], lo, hi, points),
        "sm_activity": sm if sm["total"] else None,
    }


def _series(time: np.ndarray, value: np.ndarray, lo: float, hi: float, points: int) -> dict[str, Any]:
    """Samples in [lo, hi], plus one on each side so lines reach the edges of the view."""
    order = np.argsort(time, kind="stable")
    time, value = time[order], value[order]
    time, value = time[~np.isnan(value)], value[~np.isnan(value)]
    first = max(0, int(np.searchsorted(time, lo, side="left")) - 1)
    last = min(len(time), int(np.searchsorted(time, hi, side="right")) + 1)
    time, value = time[first:last], value[first:last]
    keep = minmax_indices(time, value, points, lo, hi)
    return {"total": len(time), "downsampled": len(keep) < len(time), "time": _list(time[keep], 4),
            "value": _list(value[keep], 2)}


def _intervals(table: np.ndarray, names: tuple[str, ...], label: str, origin: float, lo: float, hi: float,
               limit: int) -> dict[str, Any]:
    """Intervals overlapping the view; binned into `limit` buckets when more than `limit` of them overlap.

    `table` is [device, start, end, kind]; `share` is 1 for a single interval, the covered share for a bin.
    """
    device, start, end, kind = table[:, 0], table[:, 1] - origin, table[:, 2] - origin, table[:, 3]
    inside = (end >= lo) & (start <= hi)
    total = int(inside.sum())
    group = (device[inside] + 1) * len(names) + kind[inside]  # one number per (device, kind); device -1 is 0
    if total > limit and hi > lo:
        s, e, g, share = bin_intervals(start[inside], end[inside], group, lo, hi, limit)
    else:
        order = np.argsort(start[inside], kind="stable")
        s, e, g, share = start[inside][order], end[inside][order], group[order], np.ones(total)
    devices = (g // len(names) - 1).astype(np.int64)
    return {
        "total": total,
        "binned": total > limit and hi > lo,
        "start": _list(s, 4),
        "end": _list(e, 4),
        "share": _list(share, 3),
        label: [names[int(k) % len(names)] for k in g],
        "device": [None if d == md.STEP_DEVICE else int(d) for d in devices],
    }


def _list(values: np.ndarray, decimals: int) -> list[float | None]:
    """JSON-ready floats; NaN (not measured) becomes null."""
    return [None if math.isnan(v) else v for v in np.round(values.astype(np.float64), decimals).tolist()]
