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
    >>> digest.steps.rows, digest.steps.sums           # figures: rnnmon.analysis.digest_figures
    >>> RunDigest.loads(digest.dumps())            # aggregates only: approximate figures
"""

from __future__ import annotations

import json
import math
import zlib
from typing import Any

import numpy as np

from rnnmon.format import schema

CAP = 65536  # rows kept whole per table: below it every figure is exact
RECORD_STEPS = 65536  # steps per digest record the writer writes
MAX_HEADER_BYTES = 64 << 10  # a record's JSON header at most (8 GPUs: 3.6 KB)
MAX_INFLATED_BYTES = 16 << 20  # a record's arrays at most, inflated (8 GPUs: 214 KB), so a zlib bomb stops here
TOP = 256  # slowest steps kept whole (slow steps, recompiles)
LONGEST = 20  # longest gaps kept whole
LOW, HIGH, SUB = -10, 24, 64  # buckets from 2^-10 ms to 2^24 ms, 64 per octave; bucket 0: at or below 2^-10 ms
BUCKETS = (HIGH - LOW) * SUB + 1
RELATIVE_ERROR = 2 ** (1 / (2 * SUB)) - 1  # 0.54%: a bucket's geometric middle against any value in it
GAP_HISTOGRAM_MS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000, 300000, math.inf)
STAT_MAX = ("memory_used_mib", "memory_total_mib")
STAT_MEAN = ("power_w", "sm_activity_pct", "sm_occupancy_pct")
# Each GPU's stats fields, stored by these names: the maxima, then a sum and a count per mean
STAT_FIELDS = (*(f"{name}.max" for name in STAT_MAX), *(f"{name}.{part}" for name in STAT_MEAN
                                                           for part in ("sum", "count")))
_STAT_DEFAULTS = {"max": math.nan, "sum": 0.0, "count": 0.0}  # a field not recorded: no values
_STEP_SCALARS = ("rows", "batches", "first_epoch", "first_start", "last_epoch", "changes", "kept", "fit_epoch")
# Layout 1 (records written until December 2026) stored these fields by position: field -> the prefix and the
# names of its parts, frozen here (layout 2 stores every part by its name, so a new column is an addition)
_LAYOUT_1 = {"scalars": ("", _STEP_SCALARS),
             "top": ("top.", ("step", "epoch", "begin", "end", "input_wait_ms", "host_gap_ms", "batches")),
             "longest": ("longest.", ("device", "start", "end", "cause")),
             "stats": ("stats.", ("memory_used_mib.max", "memory_total_mib.max", "power_w.sum", "power_w.count",
                                  "sm_activity_pct.sum", "sm_activity_pct.count", "sm_occupancy_pct.sum",
                                  "sm_occupancy_pct.count"))}
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
_STAT = {name: i for i, name in enumerate(schema.STAT_COLUMNS)}
EDGES_MS = 2.0 ** (LOW + np.arange(BUCKETS) / SUB)  # bucket k > 0 holds (edge[k-1], edge[k]]


def bucket_of(ms: np.ndarray) -> np.ndarray:
    """The bucket of each value in ms (NaN, zero and negatives: bucket 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        at = np.ceil((np.log2(ms) - LOW) * SUB)
    return np.clip(np.nan_to_num(at, nan=0.0, neginf=0.0), 0, BUCKETS - 1).astype(np.int64)


def bucket_value(k: int) -> float:
    """A bucket's representative value in ms: its geometric middle (0 for bucket 0)."""
    return 0.0 if k == 0 else float(2.0 ** (LOW + (k - 0.5) / SUB))


def quantile(counts: np.ndarray, q: float) -> float:
    """The q-quantile (0..1) of values held as bucket counts, as `np.percentile` ranks them."""
    total = int(counts.sum())
    rank = q * (total - 1)
    below = np.cumsum(counts)
    return 0.5 * (bucket_value(int(np.searchsorted(below, math.floor(rank) + 1)))
                  + bucket_value(int(np.searchsorted(below, math.ceil(rank) + 1))))


def _kept(raw: Any, rows: int, more_rows: int, more: Any) -> Any:
    """A table's whole rows, `raw` (chunks of `rows` rows: a list, or lists by kind), with `more` (`more_rows` rows,
    shaped alike) added while the table stays within CAP rows; None past it, or where either is None already."""
    if raw is None or more is None or rows + more_rows > CAP:
        return None
    if isinstance(raw, dict):
        for kind, chunks in more.items():
            raw[kind].extend(chunks)
    else:
        raw.extend(more)
    return raw


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
        self.unwaited_sums = np.zeros((2, 2))  # their step + gap s and batches, per half (0: written before it)
        self.firsts = np.empty((0, 2))  # each fit's first step: begin, end
        self.stretches = np.empty((0, 3))  # per stretch from a fit's first step: starts one?, first start, last end
        self.top = np.empty((0, len(schema.STEP_COLUMNS)))
        self.fit_epoch = math.nan  # the epoch of the latest fit's first step: what the next rows continue

    def add(self, rows: np.ndarray) -> None:
        """Steps after those already added (float64 rows of the step table's columns)."""
        if not len(rows):
            return
        self.raw = _kept(self.raw, self.rows, len(rows), [rows])
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
            self.unwaited_sums[split] += ((duration + gap)[~measured & mask].sum(), batches[~measured & mask].sum())
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
        self.raw = _kept(self.raw, self.rows, other.rows, other.raw)
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
        self.unwaited_sums += other.unwaited_sums
        self.firsts = np.r_[self.firsts, other.firsts]
        self._join(other.stretches)
        self.top = _slowest(np.r_[self.top, other.top])
        if not math.isnan(other.fit_epoch):
            self.fit_epoch = other.fit_epoch

    def state(self) -> dict[str, np.ndarray]:
        return {**{name: np.float64(getattr(self, name)) for name in _STEP_SCALARS},
                "sums": self.sums, "step_hist": self.step_hist, "wait_hist": self.wait_hist,
                "unwaited": self.unwaited, "unwaited_sums": self.unwaited_sums,
                "firsts": self.firsts, "stretches": self.stretches, **_by_column("top", self.top, schema.STEP_COLUMNS)}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> StepDigest:
        out = cls()
        out.raw = None
        out.batches, out.first_epoch, out.last_epoch, out.fit_epoch = (
            _scalar(state, name) for name in ("batches", "first_epoch", "last_epoch", "fit_epoch"))
        out.rows, out.changes, out.kept = (int(_scalar(state, name)) for name in ("rows", "changes", "kept"))
        out.first_start = bool(_scalar(state, "first_start"))
        for name in ("sums", "step_hist", "wait_hist", "unwaited", "firsts", "stretches"):
            setattr(out, name, _shaped(state[name], getattr(out, name).shape, name in ("firsts", "stretches")))
        if "unwaited_sums" in state:
            out.unwaited_sums = _shaped(state["unwaited_sums"], out.unwaited_sums.shape)
        out.top = _from_columns(state, "top", schema.STEP_COLUMNS)
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
        self.raw = _kept(self.raw, self.rows, len(rows), [rows])
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
        self.raw = _kept(self.raw, self.rows, other.rows, other.raw)
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
        return {"rows": np.float64(self.rows), "groups": self.groups, "histogram": self.histogram,
                **_by_column("longest", self.longest, schema.GAP_COLUMNS)}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> GapDigest:
        out = cls()
        out.raw = None
        out.rows = int(_scalar(state, "rows"))
        out.groups = _shaped(state["groups"], out.groups.shape, True)
        out.histogram = _shaped(state["histogram"], out.histogram.shape)
        out.longest = _from_columns(state, "longest", schema.GAP_COLUMNS)
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
        self.stats = np.array([_STAT_DEFAULTS[field.rpartition(".")[2]] for field in STAT_FIELDS])  # named there

    def add(self, kind: str, rows: np.ndarray) -> None:
        if not len(rows):
            return
        self.raw = _kept(self.raw, self.rows, len(rows), {kind: [rows]})
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
        self.raw = _kept(self.raw, self.rows, other.rows, other.raw)
        self.rows += other.rows
        self.util += other.util
        self._stats(other.stats)

    def maximum(self, column: str) -> float:
        """The largest value of a `STAT_MAX` column (NaN: none recorded)."""
        return float(self.stats[STAT_FIELDS.index(f"{column}.max")])

    def mean(self, column: str) -> float:
        """The mean of a `STAT_MEAN` column's recorded values (NaN: none recorded)."""
        at = STAT_FIELDS.index(f"{column}.sum")
        total, count = self.stats[at], self.stats[at + 1]
        return float(total / count) if count > 0 else math.nan

    def state(self) -> dict[str, np.ndarray]:
        return {"rows": np.float64(self.rows), "util": self.util,
                **{f"stats.{field}": np.float64(value) for field, value in zip(STAT_FIELDS, self.stats, strict=True)}}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> DeviceDigest:
        """Stats fields by name: one the record lacks (recorded before its column was) reads as none recorded."""
        out = cls()
        out.raw = None
        out.rows = int(_scalar(state, "rows"))
        out.util = _shaped(state["util"], out.util.shape)
        for at, field in enumerate(STAT_FIELDS):
            if f"stats.{field}" in state:
                out.stats[at] = _scalar(state, f"stats.{field}")
        return out


def _scalar(state: dict[str, np.ndarray], name: str) -> float:
    """A one-number field (layout 1 stored some as shape (1,))."""
    return float(_shaped(state[name], (1,)).reshape(-1)[0]) if np.ndim(state[name]) else float(state[name])


def _by_column(field: str, rows: np.ndarray, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Rows kept whole, stored a column at a time by name (`top.begin`, ...)."""
    return {f"{field}.{name}": rows[:, i] for i, name in enumerate(columns)}


def _from_columns(state: dict[str, np.ndarray], field: str, columns: tuple[str, ...]) -> np.ndarray:
    """Rows stored by `_by_column`, in today's `columns`: a column the record lacks is NaN, one it has and this
    rnnmon does not know is left out."""
    stored = {name: np.asarray(state[f"{field}.{name}"], dtype=np.float64) for name in columns
              if f"{field}.{name}" in state}
    lengths = {len(value) if value.ndim == 1 else -1 for value in stored.values()}
    if len(lengths) > 1 or -1 in lengths:
        raise ValueError(f"the columns of {field} differ in shape")
    out = np.full((lengths.pop() if lengths else 0, len(columns)), np.nan)
    for i, name in enumerate(columns):
        if name in stored:
            out[:, i] = stored[name]
    return out


def _shaped(value: Any, shape: tuple[int, ...], rows_vary: bool = False) -> np.ndarray:
    """`value` as float64 of `shape` (any number of rows where `rows_vary`), or ValueError."""
    array = np.asarray(value, dtype=np.float64)
    if array.shape != shape and not (rows_vary and array.ndim == 2 and array.shape[1:] == shape[1:]):
        raise ValueError(f"a digest field has shape {array.shape}, expected {shape}")
    return array


def _named(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A record's arrays with layout 1's positional fields split into named ones (layout 2's as they are)."""
    out = {}
    for name, value in arrays.items():
        group, _, field = name.partition(".")
        if field not in _LAYOUT_1:
            out[name] = value
            continue
        prefix, names = _LAYOUT_1[field]
        parts = value.T if value.ndim == 2 else value
        if value.ndim not in (1, 2) or len(parts) != len(names):
            raise ValueError(f"a layout 1 field {name} of shape {value.shape}")
        out |= {f"{group}.{prefix}{part_name}": part for part_name, part in zip(names, parts, strict=True)}
    return out


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

    def drop_rows(self) -> None:
        """Keep the aggregates only (a digest merged after records, which hold none, gives aggregates anyway)."""
        for table in (self.steps, self.gaps, *self.devices.values()):
            table.raw = None

    def merge(self, other: RunDigest) -> None:
        self.steps.merge(other.steps)
        self.gaps.merge(other.gaps)
        for device, digest in other.devices.items():
            self.devices.setdefault(device, DeviceDigest()).merge(digest)

    def dumps(self) -> bytes:
        """The aggregates (never the rows): a JSON header line naming each array and its shape, then all of them
        as float64 little-endian, zlib-compressed together. Every field under its own name (layout 2: a column
        is a field, so `loads` reads records written before or after a column was added)."""
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
            if len(header) > MAX_HEADER_BYTES:
                raise ValueError(f"a header of {len(header)} bytes")
            names = json.loads(header)
            inflater = zlib.decompressobj()
            body = np.frombuffer(bytearray(inflater.decompress(packed, MAX_INFLATED_BYTES)), dtype="<f8")  # writable
            if not inflater.eof:
                raise ValueError(f"arrays cut, or inflating past {MAX_INFLATED_BYTES} bytes")
            arrays, at = {}, 0
            for name, shape in names:
                size = math.prod(int(n) for n in shape)
                if not isinstance(name, str) or size < 0 or at + size > len(body):
                    raise ValueError(f"an array {name!r} of shape {shape} past the data")
                arrays[name], at = body[at:at + size].reshape(shape), at + size
            if at != len(body):
                raise ValueError("data after the arrays")
        # a JSONDecodeError is a ValueError; a shape of 1e999 overflows; a header nested 100,000 deep recurses
        except (ValueError, TypeError, OverflowError, RecursionError, zlib.error) as error:
            raise ValueError(f"not a digest: {error}") from None
        groups: dict[str, dict[str, np.ndarray]] = {}
        for name, value in _named(arrays).items():
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
