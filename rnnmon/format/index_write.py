"""Writing a run's reading index (`rnnmon.format.index` says what its files are): the min/max and interval
pyramids, `IndexBuilder` (located chunks into records, for the writer's files or a reader's memory) and
`IndexWriter` (the writer thread's, after each flush, with the digest's records).

Example:
    >>> writer = IndexWriter(event_path)           # fed by `rnnmon.format.writer.SummaryWriter`
    >>> writer.table(tag, rows, packed, layout, step); writer.located(step, offset, length); writer.flush()
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from rnnmon.format import packing, schema
from rnnmon.format.decode import by_name
from rnnmon.format.digest_file import DigestWriter
from rnnmon.format.index import (
    BLOCK,
    DIRECTORY,
    DOCUMENTS,
    FAN,
    INTERVALS,
    block_of,
    columns_of,
    dir_name,
    drawn,
    index_folder,
    point_dtype,
    seal,
    series_rows,
    times,
)

LOG = logging.getLogger("rnnmon")
_BEGIN, _END = schema.STEP_COLUMNS.index("begin"), schema.STEP_COLUMNS.index("end")


def _spans(tag: str, rows: np.ndarray, used: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per run of the rows `used` beginning at `starts`: their first and last time (a step from its begin to its
    end, an interval from its start to its end, a sample at its time)."""
    first, last = ((_BEGIN, _END) if tag == schema.STEPS_TAG
                   else (1, 2) if tag in (schema.GAPS_TAG, schema.PHASES_TAG) else (0, 0))
    return np.minimum.reduceat(rows[used, first], starts), np.maximum.reduceat(rows[used, last], starts)



# --- pyramids ----------------------------------------------------------------------------------------------
class _Pyramid:
    """The records one series emits as rows come: a level-0 record per block of rows, one above per FAN records."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.open: list[np.ndarray] = []  # per level: records not yet merged into the level above

    def _emit(self, level: int, records: np.ndarray) -> list[tuple[int, np.ndarray]]:
        out = [(level, seal(records))]
        if len(self.open) <= level:
            self.open.append(records[:0])
        waiting = np.concatenate([self.open[level], records])
        full = len(waiting) // FAN * FAN
        self.open[level] = waiting[full:]
        if full:
            out += self._emit(level + 1, self._merge(waiting[:full].reshape(-1, FAN)))
        return out

    def _merge(self, groups: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class PointPyramid(_Pyramid):
    """Min/max records of a time-ordered series of `columns` values; `pending` holds rows not yet in a record."""

    def __init__(self, columns: int, block: int = BLOCK) -> None:
        super().__init__(point_dtype(columns))
        self.columns = columns
        self.block = block  # rows per level-0 record
        self.pending = (np.empty(0), np.empty(0), np.empty((0, columns), dtype=np.float32))

    def add(self, time: np.ndarray, key: np.ndarray, values: np.ndarray) -> list[tuple[int, np.ndarray]]:
        time, key, values = (np.concatenate([old, new]) for old, new in zip(self.pending, (time, key, values)))
        block = self.block
        full = len(time) // block * block
        self.pending = (time[full:], key[full:], values[full:])
        if not full:
            return []
        k = self.columns
        records = np.zeros(full // block, dtype=self.dtype)
        times = time[:full].reshape(-1, block)
        records["rows"] = block
        records["t_first"], records["t_last"] = times.min(axis=1), times.max(axis=1)
        records["time"], records["key"], records["values"] = _extremes(
            times, key[:full].reshape(-1, block), values[:full].reshape(-1, block, k))
        return self._emit(0, records)

    def _merge(self, groups: np.ndarray) -> np.ndarray:
        k = self.columns
        out = np.zeros(len(groups), dtype=self.dtype)
        out["rows"] = groups["rows"].sum(axis=1)
        out["t_first"], out["t_last"] = groups["t_first"].min(axis=1), groups["t_last"].max(axis=1)
        out["time"], out["key"], out["values"] = _extremes(
            groups["time"].reshape(len(groups), -1), groups["key"].reshape(len(groups), -1),
            groups["values"].reshape(len(groups), -1, k))
        return out


def _extremes(times: np.ndarray, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per block (first axis), per column: the row of its minimum and of its maximum; NaN time where none."""
    blocks, _, k = values.shape
    out_t, out_k = np.full((blocks, 2 * k), np.nan), np.zeros((blocks, 2 * k))
    out_v = np.full((blocks, 2 * k, k), np.nan, dtype=np.float32)
    valid = ~np.isnan(times)
    for c in range(k):
        column = values[:, :, c].astype(np.float64)
        missing = np.isnan(column) | ~valid
        none = missing.all(axis=1)
        for j, (fill, pick) in enumerate(((np.inf, np.argmin), (-np.inf, np.argmax))):
            at = pick(np.where(missing, fill, column), axis=1)[:, None]
            slot = 2 * c + j
            out_t[:, slot] = np.where(none, np.nan, np.take_along_axis(times, at, axis=1)[:, 0])
            out_k[:, slot] = np.take_along_axis(keys, at, axis=1)[:, 0]
            row = np.take_along_axis(values, at[:, :, None], axis=1)[:, 0, :]
            out_v[:, slot, :] = np.where(none[:, None], np.nan, row)
    return out_t, out_k, out_v


class IntervalPyramid(_Pyramid):
    """Coverage records of one group's intervals; `pending` holds intervals not yet in a record."""

    def __init__(self) -> None:
        super().__init__(INTERVALS)
        self.pending = (np.empty(0), np.empty(0))

    def add(self, start: np.ndarray, end: np.ndarray) -> list[tuple[int, np.ndarray]]:
        start, end = (np.concatenate([old, new]) for old, new in zip(self.pending, (start, end)))
        full = len(start) // BLOCK * BLOCK
        self.pending = (start[full:], end[full:])
        if not full:
            return []
        starts, ends = start[:full].reshape(-1, BLOCK), end[:full].reshape(-1, BLOCK)
        records = np.zeros(len(starts), dtype=INTERVALS)
        records["rows"] = BLOCK
        records["t_first"], records["s_last"], records["t_last"] = starts.min(1), starts.max(1), ends.max(1)
        records["covered"] = (ends - starts).sum(axis=1)
        return self._emit(0, records)

    def _merge(self, groups: np.ndarray) -> np.ndarray:
        out = np.zeros(len(groups), dtype=INTERVALS)
        out["rows"] = groups["rows"].sum(axis=1)
        out["t_first"], out["covered"] = groups["t_first"].min(axis=1), groups["covered"].sum(axis=1)
        out["s_last"], out["t_last"] = groups["s_last"].max(axis=1), groups["t_last"].max(axis=1)
        return out


# --- building: the writer's files, or memory --------------------------------------------------------------
class IndexBuilder:
    """Turns located chunks into index records, handed to `sink(name, records)`; a series named in `since` takes
    only the chunks of events from that byte on (a reader's disk index holds the ones before)."""

    def __init__(self, sink: Any, since: dict[str, int] | None = None) -> None:
        self._sink = sink
        self.series: dict[str, PointPyramid | IntervalPyramid] = {}
        self.since = since or {}

    def add(self, tag: str, rows: np.ndarray, step: int, offset: int, length: int) -> None:
        """One chunk of `tag` (float64 rows, v1 columns) in the event at `offset` (framed `length` bytes)."""
        self.add_many(tag, rows, [len(rows)], [step], [offset], [length])

    def add_many(self, tag: str, rows: np.ndarray, counts: list[int], steps: list[int], offsets: list[int],
                 lengths: list[int], at: list[int] | None = None) -> None:
        """Chunks of `tag`, in file order: `counts[i]` rows of `rows` from the event at `offsets[i]` (`at[i]`: where
        it lies, for `since`, where the offset recorded is not that)."""
        if not len(rows) or not drawn(tag):
            return
        chunk = np.repeat(np.arange(len(counts)), counts)
        events = np.asarray(offsets if at is None else at)[chunk]
        for name, parts, used in series_rows(tag, rows):
            since = self.since.get(name, 0)
            if since:
                keep = events[used] >= since
                parts, used = tuple(x[keep] for x in parts), used[keep]
            if name == "steps":  # the directory spans each fit's warm-up step too, as a run's extent does
                used = np.flatnonzero(events >= since)
            if not len(used):
                continue
            ids = chunk[used]
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            which = ids[starts]
            entries = np.zeros(len(starts), dtype=DIRECTORY)
            entries["offset"], entries["length"] = np.asarray(offsets)[which], np.asarray(lengths)[which]
            entries["step"], entries["rows"] = np.asarray(steps)[which], np.diff(np.r_[starts, len(ids)])
            entries["t_first"], entries["t_last"] = _spans(tag, rows, used, starts)
            self._sink(dir_name(name), seal(entries))
            pyramid = self.series.get(name)
            if pyramid is None:
                pyramid = self.series[name] = (IntervalPyramid() if len(parts) == 2
                                               else PointPyramid(columns_of(name), block_of(name)))
            for level, records in pyramid.add(*parts):
                self._sink(f"{name}.L{level}", records)


class IndexWriter:
    """The index of one event file, written by the writer thread after each flush that wrote the file.

    `table` stages a chunk, `located` says where its event went, `flush` writes what was staged once the event
    file holds it. A failed write (or an event file that dropped records or was recreated) abandons the
    index: cut back to its last whole records; readers read the rest of the event file instead.
    """

    def __init__(self, event_path: str) -> None:
        self.folder = index_folder(event_path)
        self._staged: list[tuple[str, np.ndarray, int]] = []
        self._where: dict[int, tuple[int, int]] = {}
        self._buffers: dict[str, list[bytes]] = {}
        self._sizes: dict[str, int] = {}
        self._builder = IndexBuilder(lambda name, records: self._buffers.setdefault(name, []).append(
            records.tobytes()))
        self._digest = DigestWriter(self.folder)  # the summary's digest records (rnnmon.format.digest_file)
        self._documents: dict[int, None] = {}  # steps of staged events holding a document
        self.abandoned = False

    def table(self, tag: str, rows: np.ndarray, packed: bytes | None, layout: packing.Layout | None,
              step: int) -> None:
        """Stage a chunk of a drawn tag, as readers will decode it (`packed`: its packed bytes in `layout`, the
        writer's, or None where it is stored as float64 in the layout's columns) and map it by column name; one a
        reader would refuse (wrong width, a non-finite time) is left out, as readers leave it out."""
        if self.abandoned or not drawn(tag):
            return
        try:
            if packed is not None:
                rows = packing.decode(tag, packed, layout)
        except packing.FormatError as error:  # never: it was just packed; the index must not stop the writer
            self.abandon(f"a chunk it cannot decode: {error}")
            return
        columns = schema.columns_for(tag)
        if layout is not None and rows.ndim == 2 and rows.shape[1] == len(layout.columns):
            rows = by_name(tag, rows, layout.columns)[0]
        if (rows.ndim != 2 or not len(rows) or columns is None or rows.shape[1] != len(columns)
                or not np.isfinite(rows[:, times(tag)]).all()):
            return
        self._staged.append((tag, rows, step))

    def document(self, step: int) -> None:
        """The event at `step` holds a document (run description, findings, alerts, shapes): `dir.docs` lists it."""
        if not self.abandoned:
            self._documents[step] = None

    def located(self, step: int, offset: int, length: int) -> None:
        if not self.abandoned:
            self._where[step] = (offset, length)

    def flush(self) -> None:
        """Index the staged chunks: called once their events are in the file."""
        if self.abandoned:
            return
        staged, self._staged = self._staged, []
        documents, self._documents = self._documents, {}
        for tag, rows, step in staged:
            if step not in self._where:
                self.abandon("a chunk's event was not located")
                return
            self._builder.add(tag, rows, step, *self._where[step])
            if tag == schema.PHASES_TAG:
                documents[step] = None
        self._digest.add_events([(tag, rows, *self._where[step]) for tag, rows, step in staged])
        if documents:
            if not set(documents) <= set(self._where):
                self.abandon("a document's event was not located")
                return
            entries = np.zeros(len(documents), dtype=DIRECTORY)
            entries["step"] = sorted(documents)
            entries["offset"], entries["length"] = zip(*(self._where[step] for step in sorted(documents)))
            self._buffers.setdefault(DOCUMENTS, []).append(seal(entries).tobytes())
        self._where.clear()
        try:
            os.makedirs(self.folder, exist_ok=True)
            # `dir.*` first: should a later file fail, readers read from the chunks what its records lack
            for name, parts in sorted(self._buffers.items()):
                self._append(name, b"".join(parts))
            self._digest.flush()  # after the chunk directory that names what it covers
        except OSError as error:
            self.abandon(f"cannot write it ({error.strerror or error})")
        self._buffers.clear()

    def _append(self, name: str, data: bytes) -> None:
        path = os.path.join(self.folder, name)
        good = self._sizes.get(name, 0)
        try:
            with open(path, "ab", buffering=0) as out:
                view = memoryview(data)
                while view:
                    view = view[out.write(view):]
        except OSError:
            with open(path, "ab") as out:  # no torn record left for the next append to shift
                out.truncate(good)
            raise
        self._sizes[name] = good + len(data)

    def abandon(self, why: str) -> None:
        if not self.abandoned:
            self.abandoned = True
            LOG.warning("rnnmon: the reading index in %s stops here (%s); readers read the rest from the event "
                        "file.", self.folder, why)
        self._staged, self._buffers, self._documents = [], {}, {}
        self._where.clear()
