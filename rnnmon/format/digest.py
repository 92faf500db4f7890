"""A run's digest: what `rnnmon.analysis.summary` needs from its large tables (steps, gaps, GPU samples), in
accumulators that merge, so a summary costs what the digest holds, not what the run recorded.

Each table's digest keeps its rows whole while it holds at most `CAP` of them: every figure is then computed from
the rows, exactly as from the whole table. Past `CAP` (or once read back from disk) only the aggregates are kept:
- steps: counts, exact sums (durations, host gaps, input waits, batches), epochs and fit boundaries (each fit's
  first step, and per stretch between two the earliest start and the latest end), the `TOP` slowest steps (per
  batch) whole, a histogram of per-batch step time (count, duration and batches per bucket) and one of per-batch
  input wait (count, wait, batches and step + host gap per bucket; apart for the first epoch of each fit, which
  fills an input cache). Buckets are `SUB` per octave from 2^`LOW` ms: a percentile read from them is within
  `RELATIVE_ERROR` (0.54%) of a value between the two order statistics `np.percentile` interpolates. The wait
  beyond the fetch floor is computed at read time from the wait buckets (whole buckets above or below the floor
  are exact; the bucket holding the floor is taken as its sums say); the robust input share drops the largest 5%
  of waits bucket by bucket, the bucket at the cut in proportion.
- gaps: count, count and seconds per (device, cause), the duration histogram of the summary, the longest
  `LONGEST` gaps whole.
- GPU samples: per device the count, mean and a histogram of utilization by whole percent (idle fraction exact
  for an integral threshold), and per stats column the maximum or the sum and count of non-NaN values.

The writer thread writes one digest record per `RECORD_STEPS` steps beside the index (`digest`; see docs/format.md),
each the digest of the chunks since the previous one, and the byte offset its chunks end at; a reader merges the
records, then adds the chunks after the last one (`rnnmon.format.digest_read`).

Example:
    >>> digest = RunDigest()
    >>> digest.add(STEPS_TAG, rows)                # any table's float64 rows, in time order
    >>> digest.steps.figures(floor_s, cache, phases, shapes)["step_ms"]
    >>> RunDigest.loads(digest.dumps())            # aggregates only: approximate figures
"""

from __future__ import annotations

import json
import math
import zlib
from typing import Any

import numpy as np

from rnnmon.analysis.fit_time import PARTS, SLOW_FACTOR, SLOW_MIN_S, _fit_spans_s, _listed, _new_shape, _slow, fit_time
from rnnmon.analysis.input_share import OUTLIERS_FRACTION, OUTLIERS_MIN, pipeline_wait_s, robust_share
from rnnmon.format import schema

CAP = 65536  # rows kept whole per table: below it every figure is exact
RECORD_STEPS = 65536  # steps per digest record the writer writes
TOP = 256  # slowest steps kept whole (slow steps, recompiles)
LONGEST = 20  # longest gaps kept whole
LOW, HIGH, SUB = -10, 24, 64  # buckets from 2^-10 ms to 2^24 ms, 64 per octave; bucket 0: at or below 2^-10 ms
BUCKETS = (HIGH - LOW) * SUB + 1
RELATIVE_ERROR = 2 ** (1 / (2 * SUB)) - 1  # 0.54%: a bucket's geometric middle against any value in it
GAP_HISTOGRAM_MS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000, 300000, math.inf)
STAT_MAX = ("memory_used_mib", "memory_total_mib")
STAT_MEAN = ("power_w", "sm_activity_pct", "sm_occupancy_pct")
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
_STAT = {name: i for i, name in enumerate(schema.STAT_COLUMNS)}
_EDGES_MS = 2.0 ** (LOW + np.arange(BUCKETS) / SUB)  # bucket k > 0 holds (edge[k-1], edge[k]]


def bucket_of(ms: np.ndarray) -> np.ndarray:
    """The bucket of each value in ms (NaN, zero and negatives: bucket 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        at = np.ceil((np.log2(ms) - LOW) * SUB)
    return np.clip(np.nan_to_num(at, nan=0.0, neginf=0.0), 0, BUCKETS - 1).astype(np.int64)


def bucket_value(k: int) -> float:
    """A bucket's representative value in ms: its geometric middle (0 for bucket 0)."""
    return 0.0 if k == 0 else float(2.0 ** (LOW + (k - 0.5) / SUB))


def _quantile(counts: np.ndarray, q: float) -> float:
    """The q-quantile (0..1) of values held as bucket counts, as `np.percentile` ranks them."""
    total = int(counts.sum())
    rank = q * (total - 1)
    below = np.cumsum(counts)
    return 0.5 * (bucket_value(int(np.searchsorted(below, math.floor(rank) + 1)))
                  + bucket_value(int(np.searchsorted(below, math.ceil(rank) + 1))))


class StepDigest:
    """The step table's digest (see the module)."""

    def __init__(self) -> None:
        self.raw: list[np.ndarray] | None = []  # the rows while there are at most CAP
        self.rows = 0
        self.batches = 0.0
        self.first_epoch, self.first_start, self.last_epoch, self.changes = math.nan, False, math.nan, 0
        self.kept = 0
        self.sums = np.zeros(4)  # duration, host gap, input wait (measured only), measured steps: of kept steps
        self.step_hist = np.zeros((3, BUCKETS))  # per bucket of per-batch step ms: count, duration s, batches
        self.wait_hist = np.zeros((2, 4, BUCKETS))  # later / first epochs; count, wait s, batches, step+gap s
        self.unwaited = np.zeros(2)  # steps without a measured wait (in bucket 0 of wait_hist)
        self.firsts = np.empty((0, 2))  # each fit's first step: begin, end
        self.stretches = np.empty((0, 3))  # per stretch from a fit's first step: starts one?, first start, last end
        self.top = np.empty((0, len(schema.STEP_COLUMNS)))
        self.fit_epoch = math.nan  # the epoch of the latest fit's first step: what the next rows continue

    def add(self, rows: np.ndarray) -> None:
        """Steps after those already added (float64 rows of the step table's columns)."""
        if not len(rows):
            return
        if self.raw is not None:
            self.raw.append(rows)
            if self.rows + len(rows) > CAP:
                self.raw = None
        gap_ms = rows[:, _S["host_gap_ms"]]
        first = np.isnan(gap_ms)
        epoch = rows[:, _S["epoch"]]
        fit = np.cumsum(first)
        if math.isnan(self.fit_epoch):  # the first rows start a fit, whether or not they are its first step
            self.fit_epoch = float(epoch[0])
        fit_epochs = np.r_[self.fit_epoch, epoch[first]]
        filling = epoch == fit_epochs[fit]
        if first.any():
            self.fit_epoch = float(epoch[first][-1])
        inner = int(np.count_nonzero((epoch[1:] != epoch[:-1]) | first[1:]))
        joins = self.rows > 0 and (epoch[0] != self.last_epoch or bool(first[0]))
        if not self.rows:
            self.first_epoch, self.first_start = float(epoch[0]), bool(first[0])
        self.changes += inner + int(joins)
        self.last_epoch = float(epoch[-1])
        self.rows += len(rows)
        self.batches += float(rows[:, _S["batches"]].sum())
        begin, end = rows[:, _S["begin"]], rows[:, _S["end"]]
        self.firsts = np.r_[self.firsts, rows[first][:, [_S["begin"], _S["end"]]]]
        self._stretches(fit, begin - np.nan_to_num(gap_ms / 1e3), end, bool(first[0]))
        kept = ~first
        if not kept.any():
            return
        k = rows[kept]
        batches = np.maximum(k[:, _S["batches"]], 1)
        duration = k[:, _S["end"]] - k[:, _S["begin"]]
        gap = k[:, _S["host_gap_ms"]] / 1e3
        wait = k[:, _S["input_wait_ms"]] / 1e3
        measured = ~np.isnan(wait)
        self.kept += len(k)
        self.sums += (duration.sum(), gap.sum(), float(np.nansum(wait)), int(measured.sum()))
        at = bucket_of(1e3 * duration / batches)
        for row, weights in enumerate((None, duration, batches)):
            self.step_hist[row] += np.bincount(at, weights, minlength=BUCKETS)
        waits = np.nan_to_num(wait)
        at = bucket_of(1e3 * waits / batches)
        for split, mask in enumerate((~filling[kept], filling[kept])):
            for row, weights in enumerate((None, waits, batches, duration + gap)):
                self.wait_hist[split, row] += np.bincount(at[mask], None if weights is None else weights[mask],
                                                          minlength=BUCKETS)
            self.unwaited[split] += int((~measured & mask).sum())
        self.top = _slowest(np.r_[self.top, k])

    def _stretches(self, fit: np.ndarray, start: np.ndarray, end: np.ndarray, starts_fit: bool) -> None:
        ids, at = np.unique(fit, return_index=True)
        found = np.column_stack([(ids > 0) | starts_fit, np.minimum.reduceat(start, at),
                                 np.maximum.reduceat(end, at)]).astype(np.float64)
        self._join(found)

    def _join(self, found: np.ndarray) -> None:
        if len(self.stretches) and len(found) and not found[0, 0]:
            last = self.stretches[-1]
            last[1], last[2] = min(last[1], found[0, 1]), max(last[2], found[0, 2])
            found = found[1:]
        self.stretches = np.r_[self.stretches, found]

    def merge(self, other: StepDigest) -> None:
        """Add `other`, the digest of the steps after these."""
        if not other.rows:
            return
        if self.raw is not None and other.raw is not None and self.rows + other.rows <= CAP:
            self.raw += other.raw
        else:
            self.raw = None
        if self.rows:
            self.changes += int(other.first_epoch != self.last_epoch or other.first_start)
        else:
            self.first_epoch, self.first_start = other.first_epoch, other.first_start
        self.changes += other.changes
        self.last_epoch = other.last_epoch
        self.rows += other.rows
        self.batches += other.batches
        self.kept += other.kept
        self.sums += other.sums
        self.step_hist += other.step_hist
        self.wait_hist += other.wait_hist
        self.unwaited += other.unwaited
        self.firsts = np.r_[self.firsts, other.firsts]
        self._join(other.stretches)
        self.top = _slowest(np.r_[self.top, other.top])
        if not math.isnan(other.fit_epoch):
            self.fit_epoch = other.fit_epoch

    def figures(self, floor_s: float, cache: Any, phases: np.ndarray,
                shapes: list[dict[str, Any]]) -> dict[str, Any]:
        """What a summary takes from the steps (see `rnnmon.analysis.summary.summarize`)."""
        if self.raw is not None:
            return _exact(np.concatenate(self.raw) if self.raw else np.empty((0, len(schema.STEP_COLUMNS))),
                          floor_s, cache, phases, shapes)
        return self._approximate(floor_s, cache, phases, shapes)

    def _approximate(self, floor_s: float, cache: Any, phases: np.ndarray,
                     shapes: list[dict[str, Any]]) -> dict[str, Any]:
        duration_s, gap_s, wait_s, waited = self.sums.tolist()
        measured = waited > 0
        floor_ms = 0.0 if math.isnan(floor_s) else 1e3 * floor_s
        hist = self.wait_hist
        counts = hist[:, 0].sum(axis=0)
        filling_steps = int(hist[1, 0].sum()) if cache else 0
        split = measured and 0 < filling_steps < self.kept
        judged = hist[0] if split else hist.sum(axis=0)
        beyond = _beyond(judged, floor_ms)
        waits = counts.copy()
        waits[0] -= self.unwaited.sum()
        figures = {
            "steps": int(self.batches), "epochs": self.changes + 1 if self.rows else 0, "kept": self.kept,
            "duration_s": duration_s, "gap_s": gap_s, "wait_s": wait_s, "measured": measured,
            "step_ms": _hist_percentiles(self.step_hist[0]),
            "input_wait_ms": _hist_percentiles(waits) if measured else None,
            "input_share": _robust(beyond, judged[3], judged[0]) if measured else None,
            "beyond_floor_s": float(beyond.sum()) if measured else None,
            "cache_fill": None}
        if split:
            fill_beyond = _beyond(hist[1], floor_ms)
            figures["cache_fill"] = {"stage": cache, "steps": filling_steps,
                                     "wait_s": round(float(fill_beyond.sum()), 3),
                                     "input_share": _robust(fill_beyond, hist[1, 3], hist[1, 0])}
        figures["time_s"], figures["slow_count"], figures["slow_steps"] = self._fit_time(floor_s, phases, shapes)
        return figures

    def _fit_time(self, floor_s: float, phases: np.ndarray,
                  shapes: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, int], list[dict[str, Any]]]:
        """`fit_time` from the fit boundaries, the sums and the slowest steps kept, against the median read from the
        step-time buckets; slow steps beyond those kept (more than `TOP`) are counted and timed from the buckets
        wholly above the slow threshold, their cause unknown."""
        n, m = len(self.firsts), len(self.stretches)
        outline = np.zeros((n + m, len(schema.STEP_COLUMNS)))
        outline[:n, _S["host_gap_ms"]] = np.nan  # each fit's first step, then one row spanning each stretch
        outline[:n, _S["begin"]], outline[:n, _S["end"]] = self.firsts[:, 0], self.firsts[:, 1]
        outline[n:, _S["begin"]], outline[n:, _S["end"]] = self.stretches[:, 1], self.stretches[:, 2]
        duration_s, gap_s, wait_s, _ = self.sums.tolist()
        phase_s = {kind: float((phases[:, 2] - phases[:, 1])[phases[:, 0] == k].sum())
                   for k, kind in enumerate(schema.PHASE_KINDS)}
        top = self.top
        begin, batches = top[:, _S["begin"]], np.maximum(top[:, _S["batches"]], 1)
        duration = top[:, _S["end"]] - begin
        median_s = 1e-3 * _quantile(self.step_hist[0], 0.5) if self.kept else 0.0
        new_shape = _new_shape(begin, shapes)
        wait = np.nan_to_num(top[:, _S["input_wait_ms"]] / 1e3)
        excess, cause = _slow(duration, batches, pipeline_wait_s(wait, batches, floor_s), new_shape, median_s)
        recompiles, slow = float(excess[cause == "recompile"].sum()), float(excess[cause == "unknown"].sum())
        counts = {name: int((cause == name).sum()) for name in ("recompile", "input", "unknown")}
        if len(top) == TOP:  # the slow steps the top does not hold: in buckets wholly above the threshold
            threshold_ms = 1e3 * max(SLOW_FACTOR * median_s, median_s + SLOW_MIN_S)
            cut = int(bucket_of(np.array([threshold_ms]))[0]) + 1
            held = bucket_of(1e3 * duration / batches) >= cut
            rest = self.step_hist[:, cut:].sum(axis=1) - (held.sum(), duration[held].sum(), batches[held].sum())
            if rest[0] > 0:
                counts["unknown"] += int(rest[0])
                slow += max(float(rest[1] - median_s * rest[2]), 0.0)
        times = {"fit": _fit_spans_s(outline, phases), "warmup": phase_s["warmup"],
                 "steps": duration_s - recompiles - slow, "recompiles": recompiles, "slow_steps": slow,
                 "host_gaps": gap_s, "validation": phase_s["eval"], "epoch_ends": phase_s["epoch_end"],
                 "profiling": phase_s["profile"], "input_wait": wait_s}
        times["unaccounted"] = times["fit"] - sum(times[part] for part in PARTS)
        times["training"] = times["fit"] - times["warmup"]
        return ({name: round(seconds, 4) for name, seconds in times.items()}, counts,
                _listed(top, duration, excess, cause, new_shape, shapes))

    def state(self) -> dict[str, np.ndarray]:
        scalars = np.array([self.rows, self.batches, self.first_epoch, self.first_start, self.last_epoch,
                            self.changes, self.kept, self.fit_epoch], dtype=np.float64)
        return {"scalars": scalars, "sums": self.sums, "step_hist": self.step_hist, "wait_hist": self.wait_hist,
                "unwaited": self.unwaited, "firsts": self.firsts, "stretches": self.stretches, "top": self.top}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> StepDigest:
        out = cls()
        out.raw = None
        (rows, out.batches, out.first_epoch, first_start, out.last_epoch, changes, kept,
         out.fit_epoch) = state["scalars"].tolist()
        out.rows, out.first_start, out.changes, out.kept = int(rows), bool(first_start), int(changes), int(kept)
        for name in ("sums", "step_hist", "wait_hist", "unwaited", "firsts", "stretches", "top"):
            setattr(out, name, _shaped(state[name], getattr(out, name).shape, name in ("firsts", "stretches", "top")))
        if out.rows < 0 or out.kept > out.rows:
            raise ValueError(f"a digest of {out.rows} steps, {out.kept} of them kept")
        return out


def _slowest(rows: np.ndarray) -> np.ndarray:
    """The `TOP` rows of the slowest steps per batch, in time order."""
    if len(rows) <= TOP:
        return rows
    per_batch = (rows[:, _S["end"]] - rows[:, _S["begin"]]) / np.maximum(rows[:, _S["batches"]], 1)
    chosen = np.sort(np.argpartition(-per_batch, TOP - 1)[:TOP])
    return rows[chosen]


def _beyond(hist: np.ndarray, floor_ms: float) -> np.ndarray:
    """Per wait bucket: the wait beyond the fetch floor (s) of its steps."""
    beyond = np.maximum(hist[1] - 1e-3 * floor_ms * hist[2], 0.0)
    upper = _EDGES_MS
    return np.where(upper <= floor_ms, 0.0, beyond)


def _robust(part: np.ndarray, whole: np.ndarray, counts: np.ndarray) -> float | None:
    """`robust_share` over wait buckets (ascending): the largest waits dropped bucket by bucket from the top, the
    bucket at the cut in proportion to its steps."""
    total = float(counts.sum())
    if total <= 0:
        return None
    drop = max(OUTLIERS_MIN, math.ceil(OUTLIERS_FRACTION * total))
    kept = np.ones(BUCKETS)
    if total > 2 * drop:
        above = np.cumsum(counts[::-1])[::-1] - counts  # steps in the buckets above each
        taken = np.clip(drop - above, 0, counts)
        kept = np.divide(counts - taken, counts, out=np.zeros(BUCKETS), where=counts > 0)
    whole_s = float((whole * kept).sum())
    return round(float((part * kept).sum()) / whole_s, 4) if whole_s > 0 else None


def _hist_percentiles(counts: np.ndarray) -> dict[str, float | None]:
    if counts.sum() <= 0:
        return {"median": None, "p90": None}
    return {"median": round(_quantile(counts, 0.5), 4), "p90": round(_quantile(counts, 0.9), 4)}


def _exact(steps: np.ndarray, floor_s: float, cache: Any, phases: np.ndarray,
           shapes: list[dict[str, Any]]) -> dict[str, Any]:
    """The step figures from the whole step table."""
    kept = ~np.isnan(steps[:, _S["host_gap_ms"]])  # each fit's first step: tracing, iterator creation
    column = {name: steps[:, _S[name]][kept] for name in ("begin", "end", "input_wait_ms", "host_gap_ms", "batches")}
    batches = column["batches"]
    duration = column["end"] - column["begin"]
    wait = column["input_wait_ms"] / 1e3
    gap = column["host_gap_ms"] / 1e3
    measured = bool(len(wait)) and not np.isnan(wait).all()
    filling = _first_epochs(steps)[kept] if cache else np.zeros(len(duration), dtype=bool)
    split = measured and bool(filling.any()) and not filling.all()
    figures: dict[str, Any] = {
        "steps": int(steps[:, _S["batches"]].sum()), "epochs": _epochs(steps), "kept": len(duration),
        "duration_s": float(duration.sum()), "gap_s": float(gap.sum()), "wait_s": float(np.nansum(wait)),
        "measured": measured, "step_ms": _percentiles(1e3 * duration / np.maximum(batches, 1)),
        "input_wait_ms": _percentiles(1e3 * wait / np.maximum(batches, 1)) if measured else None,
        "input_share": None, "beyond_floor_s": None, "cache_fill": None}
    if measured:  # the wait beyond the fetch floor, against each step with the gap before it
        beyond, whole = pipeline_wait_s(wait, batches, floor_s), duration + gap
        judged = ~filling if split else np.ones(len(duration), dtype=bool)
        figures["input_share"] = robust_share(beyond[judged], whole[judged])
        figures["beyond_floor_s"] = float(np.nansum(beyond[judged]))
        if split:
            figures["cache_fill"] = {"stage": cache, "steps": int(filling.sum()),
                                     "wait_s": round(float(beyond[filling].sum()), 3),
                                     "input_share": robust_share(beyond[filling], whole[filling])}
    figures["time_s"], figures["slow_count"], figures["slow_steps"] = fit_time(steps, phases, shapes, floor_s)
    return figures


def _first_epochs(steps: np.ndarray) -> np.ndarray:
    """A mask of the steps in the first epoch of their fit (a fit starts at a step without a host gap)."""
    starts = np.isnan(steps[:, _S["host_gap_ms"]])
    starts[:1] = True
    fit = np.cumsum(starts) - 1
    return steps[:, _S["epoch"]] == steps[starts, _S["epoch"]][fit]


def _epochs(steps: np.ndarray) -> int:
    """The epochs the steps ran in: a new one at each change of epoch and at each fit's first step."""
    if not len(steps):
        return 0
    epoch, first = steps[:, _S["epoch"]], np.isnan(steps[:, _S["host_gap_ms"]])
    return 1 + int(np.count_nonzero((epoch[1:] != epoch[:-1]) | first[1:]))


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    values = values[~np.isnan(values)]  # fits without input timing mixed with fits with it
    if not len(values):
        return {"median": None, "p90": None}
    median, p90 = np.percentile(values, [50, 90])
    return {"median": round(float(median), 4), "p90": round(float(p90), 4)}


class GapDigest:
    """The gap table's digest: whole rows while few, else counts, seconds, the histogram and the longest gaps."""

    def __init__(self) -> None:
        self.raw: list[np.ndarray] | None = []
        self.rows = 0
        self.groups = np.zeros((0, 4))  # device, cause, count, seconds
        self.histogram = np.zeros(len(GAP_HISTOGRAM_MS) - 1)
        self.longest = np.empty((0, len(schema.GAP_COLUMNS)))

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        if self.raw is not None:
            self.raw.append(rows)
            if self.rows + len(rows) > CAP:
                self.raw = None
        self.rows += len(rows)
        duration = rows[:, 2] - rows[:, 1]
        keys, at = np.unique(rows[:, [0, 3]], axis=0, return_inverse=True)
        at = at.reshape(-1)
        self._groups(np.column_stack([keys, np.bincount(at, minlength=len(keys)),
                                      np.bincount(at, duration, minlength=len(keys))]))
        self.histogram += np.histogram(1e3 * duration, bins=GAP_HISTOGRAM_MS)[0]
        self.longest = _longest(np.r_[self.longest, rows])

    def _groups(self, found: np.ndarray) -> None:
        merged = np.r_[self.groups, found]
        keys, at = np.unique(merged[:, :2], axis=0, return_inverse=True)
        at = at.reshape(-1)
        self.groups = np.column_stack([keys, np.bincount(at, merged[:, 2], minlength=len(keys)),
                                       np.bincount(at, merged[:, 3], minlength=len(keys))])

    def merge(self, other: GapDigest) -> None:
        if not other.rows:
            return
        if self.raw is not None and other.raw is not None and self.rows + other.rows <= CAP:
            self.raw += other.raw
        else:
            self.raw = None
        self.rows += other.rows
        self._groups(other.groups)
        self.histogram += other.histogram
        self.longest = _longest(np.r_[self.longest, other.longest])

    def table(self) -> np.ndarray | None:
        """The whole gap table, while it is kept."""
        if self.raw is None:
            return None
        return np.concatenate(self.raw) if self.raw else np.empty((0, len(schema.GAP_COLUMNS)))

    def state(self) -> dict[str, np.ndarray]:
        return {"rows": np.array([self.rows], dtype=np.float64), "groups": self.groups,
                "histogram": self.histogram, "longest": self.longest}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> GapDigest:
        out = cls()
        out.raw = None
        out.rows = int(state["rows"][0])
        out.groups, out.histogram, out.longest = (_shaped(state[name], getattr(out, name).shape, name != "histogram")
                                                  for name in ("groups", "histogram", "longest"))
        return out


def longest(rows: np.ndarray, count: int) -> np.ndarray:
    """The numbers of the `count` longest intervals (start, end in columns 1, 2), longest first; of equal ones, the
    first rows (so a digest keeps the gaps a whole read lists)."""
    duration = rows[:, 2] - rows[:, 1]
    chosen = np.arange(len(rows))
    if len(rows) > count:
        chosen = np.flatnonzero(duration >= np.partition(duration, len(rows) - count)[len(rows) - count])
    return chosen[np.argsort(-duration[chosen], kind="stable")][:count]


def _longest(rows: np.ndarray) -> np.ndarray:
    return rows[np.sort(longest(rows, LONGEST))]


class DeviceDigest:
    """One GPU's samples: utilization (count, sum, whole-percent histogram) and the stats summaries keep."""

    def __init__(self) -> None:
        self.raw: dict[str, list[np.ndarray]] | None = {"util": [], "stats": []}
        self.rows = 0
        self.util = np.zeros(103)  # count, sum, then per whole percent (value in (k-1, k]: bin k; 0 and below: 0)
        self.stats = np.full((len(STAT_MAX) + 2 * len(STAT_MEAN)), np.nan)

    def add(self, kind: str, rows: np.ndarray) -> None:
        if not len(rows):
            return
        if self.raw is not None:
            self.raw[kind].append(rows)
            if self.rows + len(rows) > CAP:
                self.raw = None
        self.rows += len(rows)
        if kind == "util":
            util = rows[:, 1]
            bins = np.clip(np.ceil(np.nan_to_num(util)), 0, 100).astype(np.int64)
            self.util += np.r_[len(util), util.sum(), np.bincount(bins, minlength=101)]
            return
        found = np.full_like(self.stats, np.nan)
        with np.errstate(all="ignore"):
            for i, name in enumerate(STAT_MAX):
                column = rows[:, _STAT[name]]
                found[i] = np.nanmax(column) if not np.isnan(column).all() else np.nan
            for i, name in enumerate(STAT_MEAN):
                column = rows[:, _STAT[name]]
                found[len(STAT_MAX) + 2 * i: len(STAT_MAX) + 2 * i + 2] = np.nansum(column), (~np.isnan(column)).sum()
        self._stats(found)

    def _stats(self, found: np.ndarray) -> None:
        maxima = len(STAT_MAX)
        self.stats[:maxima] = np.fmax(self.stats[:maxima], found[:maxima])
        self.stats[maxima:] = np.nan_to_num(self.stats[maxima:]) + np.nan_to_num(found[maxima:])

    def merge(self, other: DeviceDigest) -> None:
        if not other.rows:
            return
        if self.raw is not None and other.raw is not None and self.rows + other.rows <= CAP:
            for kind in self.raw:
                self.raw[kind] += other.raw[kind]
        else:
            self.raw = None
        self.rows += other.rows
        self.util += other.util
        self._stats(other.stats)

    def figures(self, idle_pct: float) -> dict[str, Any]:
        """util_mean, idle_fraction, samples and the stats columns a summary shows."""
        if self.raw is not None:
            util = _joined(self.raw["util"], len(schema.UTIL_COLUMNS))[:, 1]
            stats = _joined(self.raw["stats"], len(schema.STAT_COLUMNS))
            return {"util_mean": _round(float(util.mean())) if len(util) else None,
                    "idle_fraction": _round(float((util <= idle_pct).mean())) if len(util) else None,
                    "samples": len(util),
                    "memory_used_max_mib": _column_stat(stats, "memory_used_mib", np.nanmax),
                    "memory_total_mib": _column_stat(stats, "memory_total_mib", np.nanmax),
                    "power_mean_w": _column_stat(stats, "power_w", np.nanmean),
                    "sm_activity_mean": _column_stat(stats, "sm_activity_pct", np.nanmean),
                    "sm_occupancy_mean": _column_stat(stats, "sm_occupancy_pct", np.nanmean)}
        count = int(self.util[0])
        idle = float(self.util[2:2 + int(np.clip(math.floor(idle_pct), -1, 100)) + 1].sum())
        maxima = len(STAT_MAX)
        means = [self.stats[maxima + 2 * i] / self.stats[maxima + 2 * i + 1] if self.stats[maxima + 2 * i + 1] > 0
                 else math.nan for i in range(len(STAT_MEAN))]
        return {"util_mean": _round(self.util[1] / count) if count else None,
                "idle_fraction": _round(idle / count) if count else None, "samples": count,
                "memory_used_max_mib": _round(self.stats[0]), "memory_total_mib": _round(self.stats[1]),
                "power_mean_w": _round(means[0]), "sm_activity_mean": _round(means[1]),
                "sm_occupancy_mean": _round(means[2])}

    def state(self) -> dict[str, np.ndarray]:
        return {"rows": np.array([self.rows], dtype=np.float64), "util": self.util, "stats": self.stats}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> DeviceDigest:
        out = cls()
        out.raw = None
        out.rows = int(state["rows"][0])
        out.util, out.stats = _shaped(state["util"], out.util.shape), _shaped(state["stats"], out.stats.shape)
        return out


def _joined(parts: list[np.ndarray], width: int) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty((0, width))


def _column_stat(stats: np.ndarray, column: str, reduce: Any) -> float | None:
    values = stats[:, _STAT[column]]
    return None if not len(values) or np.isnan(values).all() else _round(float(reduce(values)))


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(float(value), 4)


def _shaped(value: Any, shape: tuple[int, ...], rows_vary: bool = False) -> np.ndarray:
    """`value` as float64 of `shape` (any number of rows where `rows_vary`), or ValueError."""
    array = np.asarray(value, dtype=np.float64)
    if array.shape != shape and not (rows_vary and array.ndim == 2 and array.shape[1:] == shape[1:]):
        raise ValueError(f"a digest field has shape {array.shape}, expected {shape}")
    return array


class RunDigest:
    """The digests of one run's large tables: steps, gaps and each GPU's samples."""

    def __init__(self) -> None:
        self.steps = StepDigest()
        self.gaps = GapDigest()
        self.devices: dict[int, DeviceDigest] = {}

    @classmethod
    def of(cls, steps: np.ndarray, gaps: np.ndarray, util: dict[int, np.ndarray],
           stats: dict[int, np.ndarray]) -> RunDigest:
        """The digest of tables read whole."""
        out = cls()
        out.steps.add(steps)
        out.gaps.add(gaps)
        for kind, tables in (("util", util), ("stats", stats)):
            for device, rows in tables.items():
                out.devices.setdefault(device, DeviceDigest()).add(kind, rows)
        return out

    def add(self, tag: str, rows: np.ndarray) -> None:
        """A chunk of `tag`'s float64 rows (tags other than the digested tables are ignored)."""
        if tag == schema.STEPS_TAG:
            self.steps.add(rows)
        elif tag == schema.GAPS_TAG:
            self.gaps.add(rows)
        elif tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX)):
            device = schema.device_of(tag)
            if device is not None:
                kind = "util" if tag.startswith(schema.UTIL_TAG_PREFIX) else "stats"
                self.devices.setdefault(device, DeviceDigest()).add(kind, rows)

    def merge(self, other: RunDigest) -> None:
        self.steps.merge(other.steps)
        self.gaps.merge(other.gaps)
        for device, digest in other.devices.items():
            self.devices.setdefault(device, DeviceDigest()).merge(digest)

    def dumps(self) -> bytes:
        """The aggregates (never the rows): a JSON header line naming each array and its shape, then all of them
        as float64 little-endian, zlib-compressed together."""
        arrays = {f"steps.{k}": v for k, v in self.steps.state().items()}
        arrays |= {f"gaps.{k}": v for k, v in self.gaps.state().items()}
        for device, digest in self.devices.items():
            arrays |= {f"gpu{device}.{k}": v for k, v in digest.state().items()}
        header = json.dumps([[name, list(np.shape(value))] for name, value in arrays.items()]).encode()
        body = b"".join(np.ascontiguousarray(value, dtype="<f8").tobytes() for value in arrays.values())
        return header + b"\n" + zlib.compress(body, 6)

    @classmethod
    def loads(cls, data: bytes) -> RunDigest:
        """A digest from `dumps`' bytes; ValueError where they are not one."""
        try:
            header, _, packed = data.partition(b"\n")
            names = json.loads(header)
            body = np.frombuffer(bytearray(zlib.decompress(packed)), dtype="<f8")  # writable: merged into
            arrays, at = {}, 0
            for name, shape in names:
                size = math.prod(int(n) for n in shape)
                if not isinstance(name, str) or size < 0 or at + size > len(body):
                    raise ValueError(f"an array {name!r} of shape {shape} past the data")
                arrays[name], at = body[at:at + size].reshape(shape), at + size
            if at != len(body):
                raise ValueError("data after the arrays")
        except (ValueError, TypeError, zlib.error) as error:  # a JSONDecodeError is a ValueError
            raise ValueError(f"not a digest: {error}") from None
        groups: dict[str, dict[str, np.ndarray]] = {}
        for name, value in arrays.items():
            group, _, field = name.partition(".")
            groups.setdefault(group, {})[field] = value
        out = cls()
        try:
            out.steps = StepDigest.from_state(groups.pop("steps"))
            out.gaps = GapDigest.from_state(groups.pop("gaps"))
            for group, state in groups.items():
                if not group.startswith("gpu") or not group[3:].isdigit():
                    raise ValueError(f"an unknown part {group}")
                out.devices[int(group[3:])] = DeviceDigest.from_state(state)
        except KeyError as error:
            raise ValueError(f"a digest without {error}") from None
        return out
