"""A run's reading index: what a reader needs to draw any window of a run without visiting every step.

The writer thread writes it beside each event file at every flush (`IndexWriter`, fed by `SummaryWriter`), in
append-only files under `<run>/rnnmon-index/<event file's suffix>/` (no name holds "tfevents": TensorBoard never
loads them). Every file is a sequence of fixed-size little-endian records, each ending in the CRC-32 of its other
bytes, so a reader finds a record by its number and drops a torn last one:
- `dir.<series>`: one record per chunk holding rows of a drawn series: where its event lies in the event file
  (offset, framed length, event step), the series' rows in it, and their first and last time. A short window is
  read straight from those events, each checked against the index (length, checksums, event step): where they
  disagree, the data wins.
- `<series>.L<k>`: level k of a min/max pyramid of a drawn series (`steps`: input wait, compute and host gap in
  ms by begin time; `util<N>`, `sm<N>`: a GPU's utilization and SM activity). A level-0 record covers `BLOCK` rows,
  a level-k+1 record `FAN` level-k records; each keeps, per column, the row holding its minimum and the row holding
  its maximum (time, key and all columns). A window reads the level whose record count fits the points shown, and a
  one-sample spike is an extreme of its record at every level, so it is always drawn.
- `gaps.d<D>.c<C>.L<k>`, `phases.k<K>.L<k>`: interval coverage of one group (device and cause, phase kind): per
  record of `BLOCK` intervals (or `FAN` records), their count, first start, last start, last end and covered seconds.
- `dir.docs`: the events holding a document or phases (`rows` 0, times 0), and `digest`: the run digest's records
  (`rnnmon.format.digest_file`); a summary reads these (`rnnmon.format.digest_read`), `FileIndex` does not.

Rows a writer has not closed a level-0 record for yet (fewer than `BLOCK` per series) are read from the event file
through `dir.*`. A reader (`FileIndex`) takes the index as far as it goes, then the event file's bytes after the last
chunk it names, indexed in memory: a run written before the index existed (formats 1 and 2), or whose index was lost
or disagrees with its data, is indexed in memory on first read, a bounded batch of records at a time.

Example:
    >>> index = RunIndex("runs/exp1/rnnmon")       # one FileIndex per event file
    >>> index.refresh()                            # new index records and new event bytes only
    >>> index.points("steps", lo, hi, records=1700)   # candidate rows of a window: (time, key, values)
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import mmap
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from rnnmon.format import packing, schema
from rnnmon.format.digest_file import DigestWriter
from rnnmon.format.eventfile import EVENT_FILE_MARK, RecordCursor, masked_crc32c, open_regular, truncated_at
from rnnmon.format.reader import TAIL_GRACE_S, InvalidRecord, Stored, by_name, decode_chunks, raw_value, stored_as

LOG = logging.getLogger("rnnmon")
INDEX_DIR = "rnnmon-index"
BLOCK = 64  # rows per level-0 record
FAN = 16  # level-k records per level-k+1 record
HEAD_STEP_BYTES = 64 << 10  # a file's head is read this much at a time, until what is looked for is found
SCAN_BYTES = 1 << 20  # event bytes indexed in memory at a time (a run without an index): ~4 MB of rows at once
READ_BYTES = 1 << 20  # index file bytes read at a time
DRAWN_TAGS = (schema.STEPS_TAG, schema.PHASES_TAG, schema.GAPS_TAG)  # and the util and stats tags of every GPU
DOCUMENTS = "dir.docs"  # the events holding a document or phases (a summary reads them; `FileIndex` does not)
_SM = schema.STAT_COLUMNS.index("sm_activity_pct")
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}

DIRECTORY = np.dtype([("offset", "<u8"), ("length", "<u4"), ("step", "<i8"), ("rows", "<u4"), ("t_first", "<f8"),
                      ("t_last", "<f8"), ("crc", "<u4")])
INTERVALS = np.dtype([("rows", "<u4"), ("t_first", "<f8"), ("s_last", "<f8"), ("t_last", "<f8"),
                      ("covered", "<f8"), ("crc", "<u4")])


def point_dtype(columns: int) -> np.dtype:
    """A pyramid record of a series of `columns` values: slot 2c holds column c's minimum row, 2c+1 its maximum."""
    slots = 2 * columns
    return np.dtype([("rows", "<u4"), ("t_first", "<f8"), ("t_last", "<f8"), ("time", "<f8", (slots,)),
                     ("key", "<f8", (slots,)), ("values", "<f4", (slots, columns)), ("crc", "<u4")])


def columns_of(series: str) -> int:
    return 3 if series == "steps" else 1


def dtype_of(name: str) -> np.dtype:
    """The record type of index file `name`."""
    if name.startswith("dir."):
        return DIRECTORY
    series = name.rsplit(".L", 1)[0]
    return INTERVALS if series.startswith(("gaps.", "phases.")) else point_dtype(columns_of(series))


def index_folder(event_path: str) -> str:
    """The index folder of an event file: `<run>/rnnmon-index/<the file name after "tfevents.">`."""
    folder, name = os.path.split(event_path)
    return os.path.join(folder, INDEX_DIR, name.split(EVENT_FILE_MARK, 1)[-1].lstrip("."))


def drawn(tag: str) -> bool:
    return tag in DRAWN_TAGS or (tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX))
                                 and schema.device_of(tag) is not None)


def _times(tag: str) -> slice:
    """The time columns of a drawn tag's rows."""
    if tag == schema.STEPS_TAG:
        return slice(2, 4)
    return slice(1, 3) if tag in (schema.GAPS_TAG, schema.PHASES_TAG) else slice(0, 1)


def _dir_name(series: str) -> str:
    return "dir." + series


def seal(records: np.ndarray) -> np.ndarray:
    """Set each record's CRC over its other bytes."""
    raw = records.view(np.uint8).reshape(len(records), records.dtype.itemsize)
    records["crc"] = [zlib.crc32(row[:-4].tobytes()) for row in raw]
    return records


def intact(records: np.ndarray) -> bool:
    """Every record's CRC matches."""
    size = records.dtype.itemsize
    raw = memoryview(np.ascontiguousarray(records).view(np.uint8).reshape(-1))  # sliced without copies
    return all(zlib.crc32(raw[at:at + size - 4]) == crc
               for at, crc in zip(range(0, len(raw), size), records["crc"].tolist()))


# --- series: what is drawn, from a chunk of a table --------------------------------------------------------
def series_of(tag: str, rows: np.ndarray) -> Iterator[tuple[str, tuple[np.ndarray, ...]]]:
    """(series, (time, key, values)) for drawn points, (series, (start, end)) for intervals, of a table's rows."""
    for name, parts, _ in _series_rows(tag, rows):
        yield name, parts


def _series_rows(tag: str, rows: np.ndarray) -> Iterator[tuple[str, tuple[np.ndarray, ...], np.ndarray]]:
    """`series_of`, with the numbers of the rows each series took, in order."""
    if tag == schema.STEPS_TAG:
        used = np.flatnonzero(~np.isnan(rows[:, _S["host_gap_ms"]]))  # each fit's first step is its warm-up
        kept = rows[used]
        wait = kept[:, _S["input_wait_ms"]]
        values = np.column_stack([wait, 1e3 * (kept[:, _S["end"]] - kept[:, _S["begin"]]) - np.nan_to_num(wait),
                                  kept[:, _S["host_gap_ms"]]]).astype(np.float32)
        yield "steps", (kept[:, _S["begin"]], kept[:, _S["step"]].astype(np.float64), values), used
    elif tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX)):
        device = schema.device_of(tag)
        util = tag.startswith(schema.UTIL_TAG_PREFIX)
        value = rows[:, 1] if util else rows[:, _SM]
        used = np.flatnonzero(~np.isnan(value))
        yield (f"util{device}" if util else f"sm{device}"), (
            rows[used, 0], np.zeros(len(used)), value[used].astype(np.float32)[:, None]), used
    elif tag in (schema.GAPS_TAG, schema.PHASES_TAG):
        gaps = tag == schema.GAPS_TAG
        kinds = len(schema.GAP_CAUSES) if gaps else 1
        codes = ((rows[:, 0] + 1) * kinds + rows[:, 3]).astype(np.int64) if gaps else rows[:, 0].astype(np.int64)
        for code in np.flatnonzero(np.bincount(codes)).tolist():  # devices from -1, causes and kinds from 0
            used = np.flatnonzero(codes == code)
            name = f"gaps.d{code // kinds - 1}.c{code % kinds}" if gaps else f"phases.k{code}"
            yield name, (rows[used, 1], rows[used, 2]), used


def _spans(tag: str, rows: np.ndarray, used: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per run of the rows `used` beginning at `starts`: their first and last time (a step from its begin to its
    end, an interval from its start to its end, a sample at its time)."""
    first, last = ((_S["begin"], _S["end"]) if tag == schema.STEPS_TAG
                   else (1, 2) if tag in (schema.GAPS_TAG, schema.PHASES_TAG) else (0, 0))
    return np.minimum.reduceat(rows[used, first], starts), np.maximum.reduceat(rows[used, last], starts)


# --- pyramids ----------------------------------------------------------------------------------------------
class _Pyramid:
    """The records one series emits as rows come: a level-0 record per BLOCK rows, one above per FAN records."""

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

    def __init__(self, columns: int) -> None:
        super().__init__(point_dtype(columns))
        self.columns = columns
        self.pending = (np.empty(0), np.empty(0), np.empty((0, columns), dtype=np.float32))

    def add(self, time: np.ndarray, key: np.ndarray, values: np.ndarray) -> list[tuple[int, np.ndarray]]:
        time, key, values = (np.concatenate([old, new]) for old, new in zip(self.pending, (time, key, values)))
        full = len(time) // BLOCK * BLOCK
        self.pending = (time[full:], key[full:], values[full:])
        if not full:
            return []
        k = self.columns
        records = np.zeros(full // BLOCK, dtype=self.dtype)
        times = time[:full].reshape(-1, BLOCK)
        records["rows"] = BLOCK
        records["t_first"], records["t_last"] = times.min(axis=1), times.max(axis=1)
        records["time"], records["key"], records["values"] = _extremes(
            times, key[:full].reshape(-1, BLOCK), values[:full].reshape(-1, BLOCK, k))
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
        for name, parts, used in _series_rows(tag, rows):
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
            self._sink(_dir_name(name), seal(entries))
            pyramid = self.series.get(name)
            if pyramid is None:
                pyramid = self.series[name] = (IntervalPyramid() if len(parts) == 2
                                               else PointPyramid(columns_of(name)))
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
                or not np.isfinite(rows[:, _times(tag)]).all()):
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
            self._digest.add(tag, rows, *self._where[step])
            if tag == schema.PHASES_TAG:
                documents[step] = None
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


# --- reading -------------------------------------------------------------------------------------------------
class IndexMismatch(ValueError):
    """The index and its event file disagree: the index is not used."""


@dataclasses.dataclass
class Part:
    """A stretch of one event file's index: record arrays by file name, and per series the rows after its last
    level-0 record (time, key, values) or (start, end)."""

    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    rest: dict[str, tuple[np.ndarray, ...]] = dataclasses.field(default_factory=dict)
    mapped: frozenset[str] = frozenset()  # arrays mapped from the index files: the page cache's, not memory held

    def levels(self, series: str) -> list[np.ndarray]:
        out = []
        while f"{series}.L{len(out)}" in self.arrays:
            out.append(self.arrays[f"{series}.L{len(out)}"])
        return out

    def nbytes(self, memory_only: bool) -> int:
        held = [a for name, a in self.arrays.items() if not (memory_only and name in self.mapped)]
        return sum(a.nbytes for a in held) + sum(x.nbytes for parts in self.rest.values() for x in parts)


class _MemorySink:
    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {}

    def __call__(self, name: str, records: np.ndarray) -> None:
        self.parts.setdefault(name, []).append(records)

    def arrays(self) -> dict[str, np.ndarray]:
        for parts in self.parts.values():
            if len(parts) > 1:
                parts[:] = [np.concatenate(parts)]
        return {name: parts[0] for name, parts in self.parts.items()}


class FileIndex:
    """The index of one event file as a reader sees it: the index on disk as far as the data agrees with it, then
    the event file's later bytes indexed in memory. `refresh()` takes in what was written since."""

    def __init__(self, event_path: str) -> None:
        self.path = event_path
        self.folder = index_folder(event_path)
        self.disk = Part()
        self.memory = Part()
        self.notes: list[str] = []
        self._errors: dict[str, None] = {}  # in the order found, each once
        self._trust_disk = True
        self._disk_version: tuple[tuple[str, int], ...] | None = None
        self._cursor = RecordCursor(0)
        self._sink = _MemorySink()
        self._builder = IndexBuilder(self._sink)
        self._stored: dict[str, Stored] = {}  # how the file describes each drawn tag (format 3: by column name)
        self._head = head_records(event_path, SCAN_BYTES)  # read on by `stored`, as far as it needs

    def refresh(self) -> None:
        if self._trust_disk:
            version = self._version()
            if version != self._disk_version:
                self._disk_version = version
                try:
                    self._open_disk()
                except IndexMismatch as error:
                    self._distrust(str(error))
                except Exception as error:  # any other failure of the index: the data wins, with a note
                    self._distrust(f"{type(error).__name__}: {error}")
        self._scan_rest()

    def _version(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of the index's files: regular files named as the index names them, nothing else."""
        try:
            with os.scandir(self.folder) as entries:
                return tuple(sorted((e.name, e.stat().st_size) for e in entries
                                    if _INDEX_FILE.fullmatch(e.name) and e.is_file()))
        except OSError:
            return ()

    def damaged(self, why: str) -> IndexMismatch:
        """Stop using the disk index (the data wins, with a note); the error to raise, so the caller asks again."""
        if self._trust_disk:
            self._distrust(why)
            self._scan_rest()
        return IndexMismatch(why)

    def _distrust(self, why: str) -> None:
        self.notes.append(f"{os.path.basename(self.path)}: its reading index disagrees with the data ({why}); "
                          "read from the event file instead")
        self._trust_disk = False
        self.disk = Part()
        self._restart(0)

    def _restart(self, offset: int, since: dict[str, int] | None = None) -> None:
        self._cursor = RecordCursor(offset)
        self._sink = _MemorySink()
        self._builder = IndexBuilder(self._sink, since)
        self.memory = Part()

    def _open_disk(self) -> None:
        """Map the index files (whole records only), check them against the event file, read the rows after
        each series' last level-0 record. Each series is read from the index as far as its chunk directory
        reaches, and from the event file after that: the scan starts at the directory that reaches least (a
        lagging file: an upload pass that failed midway); a series whose directory is lost is read from the event
        file whole (its pyramid set aside, with a note)."""
        arrays: dict[str, np.ndarray] = {}
        for name, size in self._disk_version or ():
            count = size // dtype_of(name).itemsize
            if count:
                arrays[name] = _mapped(os.path.join(self.folder, name), dtype_of(name), count)
        try:
            event_size = os.path.getsize(self.path)
        except OSError:
            event_size = 0
        reach: dict[str, int] = {}
        for name, array in arrays.items():
            if not intact(array[-1:]) or not intact(array[:1]):
                raise IndexMismatch(f"{name}: a record's checksum fails")
            if name.startswith("dir."):
                if len(array) > event_size // MIN_EVENT_BYTES + 1:
                    raise IndexMismatch(f"{name} names more events than the event file holds")
                reach[name[4:]] = int(array[-1]["offset"]) + int(array[-1]["length"])
        end = max(reach.values(), default=0)
        if end > event_size:
            raise IndexMismatch(f"it names {end} bytes of events, the event file holds {event_size}")
        lost = sorted({name.rsplit(".L", 1)[0] for name in arrays if not name.startswith("dir.")} - set(reach))
        for series in lost:
            self.notes.append(f"{os.path.basename(self.path)}: its reading index lacks {_dir_name(series)}; "
                              f"{series} is read from the event file instead")
            arrays = {name: array for name, array in arrays.items() if name.rsplit(".L", 1)[0] != series}
        last_time = {}
        for name, array in arrays.items():  # the last chunk of each series is where the index says, as it says
            if name.startswith("dir."):
                rows = self._chunk(array[-1], _tag_of(name[4:]))
                times = [parts[0] for found, parts in series_of(_tag_of(name[4:]), rows) if found == name[4:]]
                last_time[name[4:]] = float(times[0].max()) if times and len(times[0]) else -np.inf
        for name in list(arrays):  # a pyramid ahead of its directory: only the records the directory covers
            series = name.rsplit(".L", 1)[0]
            if not name.startswith("dir.") and series in last_time:
                arrays[name] = arrays[name][:_bisect(arrays[name], "t_last", last_time[series], "right")]
        part = Part(arrays, mapped=frozenset(arrays))
        for name in arrays:
            if name.startswith("dir."):
                part.rest[name[4:]] = self._rest_of(part, name[4:])
        self.disk = part
        self._restart(0 if lost else min(reach.values(), default=0), reach)

    def _rest_of(self, part: Part, series: str) -> tuple[np.ndarray, ...]:
        """The rows of `series` after its last level-0 record, read from the chunks its directory names."""
        tag = _tag_of(series)
        directory = part.arrays[_dir_name(series)]
        level0 = part.arrays.get(f"{series}.L0")
        interval = series.startswith(("gaps.", "phases."))
        after = -np.inf if level0 is None else float(level0[-1]["s_last" if interval else "t_last"])
        chunk = np.array(directory[_bisect(directory, "t_last", after, "right"):])
        if not intact(chunk):
            raise IndexMismatch(f"{_dir_name(series)}: a record's checksum fails")
        pieces = [_empty(series)]
        for entry in chunk:
            for name, parts in series_of(tag, self._chunk(entry, tag)):
                if name == series:
                    keep = parts[0] > after
                    pieces.append(tuple(x[keep] for x in parts))
        return tuple(np.concatenate([p[i] for p in pieces]) for i in range(len(pieces[0])))

    def _scan_rest(self) -> None:
        """Index in memory the event file's records after the last chunk the disk index names (new ones only)."""
        grew, more = False, True
        while more:
            start = self._cursor.offset
            try:
                scan = self._cursor.scan(self.path, SCAN_BYTES)
            except OSError as error:
                self._errors[f"{os.path.basename(self.path)}: cannot read: {error.strerror or error}"] = None
                return
            more = scan.more
            if scan.problem:
                self._errors[f"{os.path.basename(self.path)}: {scan.problem}"] = None
            if scan.truncated and time.time() - scan.modified > TAIL_GRACE_S:
                self._errors[f"{os.path.basename(self.path)}: {truncated_at(scan.offset)}"] = None
            position = start
            staged: dict[str, list[tuple[int, int, int, int, Any]]] = {}
            for record in scan.records:
                length = len(record) + 16
                where = (position, length) if scan.problem is None else (0, 0)  # not located: never read back
                event = marked_event(record, _MARKS)
                if event is not None:
                    for value in event.summary.value:
                        if drawn(value.tag):
                            self._learn(value)
                            staged.setdefault(value.tag, []).append((event.step, *where, position, value.tensor))
                position += length
            for tag, chunks in staged.items():
                tensors = [tensor for *_, tensor in chunks]
                rows, counts, kept, failed = decode_chunks(tag, tensors, self._stored.get(tag))
                self._errors.update(dict.fromkeys(f"{tag} at step {chunks[i][0]}: {error}" for i, error in failed))
                self._builder.add_many(tag, rows, counts, *([chunks[i][n] for i in kept] for n in range(4)))
                grew = True
        if grew:
            self.memory = Part(self._sink.arrays(), {
                name: pyramid.pending for name, pyramid in self._builder.series.items()})

    def _learn(self, value: Any) -> None:
        """Keep how a value's metadata describes its tag (its first value in the file carries it)."""
        stored = stored_by(value)
        if stored is not None:
            self._stored[value.tag] = stored

    def stored(self, tag: str) -> Stored | None:
        """How this file describes `tag`: learnt from its records, or from its first `SCAN_BYTES` where the scan
        started past them (a disk index), read only as far as the tag's first value; None (as this reader writes
        it) where they do not say."""
        for records in self._head:
            if tag in self._stored:
                break
            for event in filter(None, (marked_event(record, _MARKS) for record in records)):
                for value in event.summary.value:
                    if drawn(value.tag) and value.tag not in self._stored:
                        self._learn(value)
        return self._stored.get(tag)

    @property
    def errors(self) -> list[str]:
        """Damage found in the event bytes this reader read (as `RunReader` names it)."""
        return list(self._errors)

    def parts(self) -> list[Part]:
        return [self.disk, self.memory]

    def _chunk(self, entry: np.void, tag: str) -> np.ndarray:
        return read_chunk(self.path, entry, tag, self.stored(tag))

    def read(self, entry: np.void, series: str) -> np.ndarray:
        """The rows of the chunk `entry` names; a disagreement stops the disk index's use (and raises)."""
        try:
            return self._chunk(entry, _tag_of(series))
        except IndexMismatch as error:
            raise self.damaged(str(error)) from None


_INDEX_FILE = re.compile(r"dir\.(steps|util\d+|sm\d+|gaps\.d-?\d+\.c\d+|phases\.k\d+)"
                         r"|(steps|util\d+|sm\d+|gaps\.d-?\d+\.c\d+|phases\.k\d+)\.L\d+")


MIN_EVENT_BYTES = 16  # an event's framing alone: a chunk directory names at most one record per this many bytes


def read_directory(path: str, event_size: int, last: bool = False) -> np.ndarray:
    """Every whole record of the chunk directory (`dir.*`) at `path` (with `last`, the last one only), read as
    event files are read: a regular file only, opened non-blocking, its size taken from the descriptor.
    IndexMismatch where it cannot be read, or names more events than an event file of `event_size` bytes can hold
    (a huge sparse file is refused before any read); FileNotFoundError where there is none."""
    name = os.path.basename(path)
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise IndexMismatch(f"cannot read {name}: {error.strerror or error}") from None
    try:
        count = os.fstat(fd).st_size // DIRECTORY.itemsize
        if count > event_size // MIN_EVENT_BYTES + 1:
            raise IndexMismatch(f"{name} names {count} events, more than its event file of {event_size} bytes holds")
        first = count - 1 if last and count else 0
        data = bytearray()
        while len(data) < (count - first) * DIRECTORY.itemsize:
            piece = os.pread(fd, min(READ_BYTES, (count - first) * DIRECTORY.itemsize - len(data)),
                             first * DIRECTORY.itemsize + len(data))
            if not piece:
                break  # cut while read: its whole records so far
            data += piece
    finally:
        os.close(fd)
    return np.frombuffer(bytes(data), dtype=DIRECTORY, count=len(data) // DIRECTORY.itemsize)


def _mapped(path: str, dtype: np.dtype, count: int) -> np.ndarray:
    """The first `count` records of the index file at `path`, mapped read-only; a FIFO, a device or a file cut
    below them is a disagreement (IndexMismatch), never a hang."""
    try:
        fd = open_regular(path)
    except OSError as error:
        raise IndexMismatch(f"cannot read {os.path.basename(path)}: {error.strerror or error}") from None
    try:
        if os.fstat(fd).st_size < count * dtype.itemsize:
            raise IndexMismatch(f"{os.path.basename(path)} was cut")
        mapped = mmap.mmap(fd, count * dtype.itemsize, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    return np.frombuffer(mapped, dtype=dtype, count=count)


_MARKS = tuple(tag.encode() for tag in (schema.STEPS_TAG, schema.PHASES_TAG, schema.GAPS_TAG, schema.UTIL_TAG_PREFIX,
                                        schema.STATS_TAG_PREFIX))


def _empty(series: str) -> tuple[np.ndarray, ...]:
    if series.startswith(("gaps.", "phases.")):
        return np.empty(0), np.empty(0)
    return np.empty(0), np.empty(0), np.empty((0, columns_of(series)), dtype=np.float32)


def _tag_of(series: str) -> str:
    if series == "steps":
        return schema.STEPS_TAG
    if series.startswith("util"):
        return f"{schema.UTIL_TAG_PREFIX}{series[4:]}"
    if series.startswith("sm"):
        return f"{schema.STATS_TAG_PREFIX}{series[2:]}"
    return schema.GAPS_TAG if series.startswith("gaps.") else schema.PHASES_TAG


def marked_event(record: bytes, marks: tuple[bytes, ...]) -> Any:
    """The event in `record` where it names one of `marks` (tags, as bytes) and decodes; else None."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    if not any(mark in record for mark in marks):
        return None
    try:
        return event_pb2.Event.FromString(record)
    except DecodeError:
        return None


def stored_by(value: Any) -> Stored | None:
    """How an rnnmon summary value's metadata describes its tag (the first value of a tag in a file carries it)."""
    if value.HasField("metadata") and value.metadata.plugin_data.plugin_name == schema.PLUGIN_NAME:
        return stored_as(value.tag, schema.parse_content(value.metadata.plugin_data.content))
    return None


def listed_documents(event_path: str, through: int) -> list[bytes] | None:
    """The records of the events `dir.docs` lists before byte `through`, each checked (framing, both checksums,
    each after the one before); None where the index has no `dir.docs` (written before it: scan the file instead);
    IndexMismatch where `dir.docs` cannot be read or a listed event is not whole."""
    try:
        event_size = os.path.getsize(event_path)
        entries = read_directory(os.path.join(index_folder(event_path), DOCUMENTS), event_size)
    except FileNotFoundError:
        return None
    if not intact(entries):
        raise IndexMismatch(f"{DOCUMENTS}: a record's checksum fails")
    entries = entries[entries["offset"] < through]
    records, after = [], 0
    fd = open_regular(event_path)
    try:
        for offset, length in zip(entries["offset"].tolist(), entries["length"].tolist()):
            if offset < after or offset + length > event_size:  # listed twice, overlapping, or past the file
                raise IndexMismatch(f"no whole event at byte {offset}, where {DOCUMENTS} lists one")
            data = os.pread(fd, length, offset)
            size = length - 16
            if (len(data) != length or length < 16 or struct.unpack_from("<Q", data)[0] != size
                    or struct.unpack_from("<I", data, 8)[0] != masked_crc32c(data[:8])
                    or struct.unpack_from("<I", data, 12 + size)[0] != masked_crc32c(data[12:12 + size])):
                raise IndexMismatch(f"no whole event at byte {offset}, where {DOCUMENTS} lists one")
            records.append(data[12:12 + size])
            after = offset + length
    finally:
        os.close(fd)
    return records


def listed_through(event_path: str) -> int:
    """The end of the last event the index of `event_path` names (0: none, or no index): every document event
    before it is in `dir.docs` (a flush writes `dir.*` before its other files, `dir.docs` first, whole records in
    step order). IndexMismatch where a directory cannot be read, or its last record fails its checksum or names
    bytes past the event file's end."""
    end = 0
    folder = index_folder(event_path)
    try:
        names = [name for name in os.listdir(folder)
                 if name == DOCUMENTS or (name.startswith("dir.") and _INDEX_FILE.fullmatch(name))]
    except OSError:
        return 0
    event_size = os.path.getsize(event_path)
    for name in names:
        try:
            last = read_directory(os.path.join(folder, name), event_size, last=True)
        except FileNotFoundError:
            continue
        if not intact(last):
            raise IndexMismatch(f"{name}: a record's checksum fails")
        if len(last):
            end = max(end, int(last[0]["offset"]) + int(last[0]["length"]))
    if end > event_size:
        raise IndexMismatch(f"it names {end} bytes of events, the event file holds {event_size}")
    return end


def read_chunk(path: str, entry: np.void, tag: str, stored: Stored | None = None) -> np.ndarray:
    """The rows of `tag` in the event `entry` names, checked: framing, both checksums, event step, the tag."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    offset, length, step = int(entry["offset"]), int(entry["length"]), int(entry["step"])
    if length < 16:
        raise IndexMismatch(f"no event located for step {step}")
    try:
        fd = open_regular(path)
    except OSError as error:
        raise IndexMismatch(f"cannot read the event file: {error.strerror or error}") from None
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    size = length - 16
    if (len(data) != length or struct.unpack_from("<Q", data)[0] != size
            or struct.unpack_from("<I", data, 8)[0] != masked_crc32c(data[:8])
            or struct.unpack_from("<I", data, 12 + size)[0] != masked_crc32c(data[12:12 + size])):
        raise IndexMismatch(f"no whole event at byte {offset} of {os.path.basename(path)}")
    try:
        event = event_pb2.Event.FromString(data[12:12 + size])
    except DecodeError:
        raise IndexMismatch(f"no event at byte {offset}") from None
    if event.step != step:
        raise IndexMismatch(f"the event at byte {offset} is step {event.step}, the index says {step}")
    for value in event.summary.value:
        if value.tag == tag:
            try:
                return raw_value(tag, value.tensor, stored)
            except (InvalidRecord, ValueError) as error:
                raise IndexMismatch(f"{tag} at step {step}: {error}") from None
    raise IndexMismatch(f"the event at byte {offset} holds no {tag}")


class _Field:
    """One field of a record array as a sequence, read record by record (a memmap stays unread)."""

    def __init__(self, array: np.ndarray, field: str) -> None:
        self.array, self.field = array, field

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> float:
        return float(self.array[i][self.field])


def _bisect(array: np.ndarray, field: str, value: float, side: str) -> int:
    """`np.searchsorted` on one field of a record array, touching only log(n) records."""
    return (bisect.bisect_left if side == "left" else bisect.bisect_right)(_Field(array, field), value)


def devices_in(path: str, max_bytes: int = 1 << 20) -> dict[int, dict[str, Any]]:
    """The GPUs an event file describes (its util and stats tags' metadata: index, name, uuid, ...), from the first
    event within `max_bytes` that names any: a writer describes each tag with its first value, all GPUs in one."""
    from tensorboard.compat.proto import event_pb2

    found: dict[int, dict[str, Any]] = {}
    for record in itertools.chain.from_iterable(head_records(path, max_bytes)):
        if schema.UTIL_TAG_PREFIX.encode() not in record and schema.STATS_TAG_PREFIX.encode() not in record:
            continue
        for value in event_pb2.Event.FromString(record).summary.value:
            device = schema.device_of(value.tag)
            if device is not None and value.metadata.plugin_data.plugin_name == schema.PLUGIN_NAME:
                described = schema.parse_content(value.metadata.plugin_data.content).get("device")
                if isinstance(described, dict):
                    found.setdefault(device, described)
        if found:  # a writer's first chunk holds every GPU's first value
            return found
    return found


def head_records(path: str, max_bytes: int) -> Iterator[list[bytes]]:
    """The whole records of the first `max_bytes` of the event file at `path`, `HEAD_STEP_BYTES` at a time, so a
    reader that finds what it looks for early stops early (what a file describes is in its first records); nothing
    where it cannot be read."""
    cursor, more = RecordCursor(0), True
    while more and cursor.offset < max_bytes:
        try:
            scan = cursor.scan(path, min(HEAD_STEP_BYTES, max_bytes - cursor.offset))
        except OSError:
            return
        more = scan.more
        yield scan.records


class RunIndex:
    """The indexes of every event file of one run folder, and the GPUs they describe."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.files: dict[str, FileIndex] = {}
        self.devices: dict[int, dict[str, Any]] = {}
        self._unlisted: str | None = None

    def refresh(self) -> None:
        try:
            names = sorted(n for n in os.listdir(self.run_dir) if EVENT_FILE_MARK in n)
            self._unlisted = None
        except OSError as error:
            self._unlisted = f"cannot list {self.run_dir}: {error.strerror or error}"
            return
        for name in names:
            index = self.files.get(name)
            if index is None:
                index = self.files[name] = FileIndex(os.path.join(self.run_dir, name))
                for device, described in devices_in(index.path).items():
                    self.devices.setdefault(device, described)
            index.refresh()

    @property
    def notes(self) -> list[str]:
        return [note for index in self.files.values() for note in index.notes]

    @property
    def errors(self) -> list[str]:
        found = [error for index in self.files.values() for error in index.errors]
        return [self._unlisted, *found] if self._unlisted else found

    def nbytes(self) -> int:
        """Bytes held in memory (mapped index files are the page cache's, not counted)."""
        return sum(part.nbytes(memory_only=True) for index in self.files.values() for part in index.parts())

    def series(self, prefix: str) -> list[str]:
        """The series whose names start with `prefix`."""
        found: set[str] = set()
        for index in self.files.values():
            for part in index.parts():
                found |= {n[4:] for n in part.arrays if n.startswith("dir." + prefix)}
                found |= {n for n in part.rest if n.startswith(prefix) and len(part.rest[n][0])}
        return sorted(found)

    def extent(self) -> tuple[float, float]:
        """(first, last) Unix time of anything drawn but SM activity, from each directory's first and last chunk
        and the rows not in a record yet."""
        firsts, lasts = [], []
        for index in self.files.values():
            for part in index.parts():
                for name, array in part.arrays.items():
                    if name.startswith("dir.") and not name.startswith("dir.sm") and len(array):
                        firsts.append(float(array[0]["t_first"]))
                        lasts.append(float(array[-1]["t_last"]))
        return (min(firsts), max(lasts)) if firsts else (0.0, 0.0)

    def chunks(self, series: str, lo: float, hi: float, limit: int) -> tuple[int, list[tuple[FileIndex, Any]]]:
        """Rows of `series` in chunks overlapping [lo, hi], and those chunks, when at most `limit` chunks."""
        count = rows = 0
        found: list[tuple[FileIndex, Any]] = []
        for index in self.files.values():
            for part in index.parts():
                directory = part.arrays.get(_dir_name(series))
                if directory is None or not len(directory):
                    continue
                first = _bisect(directory, "t_last", lo, "left")
                last = _bisect(directory, "t_first", hi, "right")
                if last <= first:
                    continue
                count += last - first
                if count > limit:
                    return -1, []
                entries = np.array(directory[first:last])
                if not intact(entries):
                    raise index.damaged(f"{_dir_name(series)}: a record's checksum fails")
                rows += int(entries["rows"].sum())
                found += [(index, entry) for entry in entries]
        return rows, found

    def records(self, series: str, lo: float, hi: float, wanted: int) -> tuple[list[np.ndarray], list[tuple]]:
        """Pyramid records of `series` that may overlap [lo, hi], from the coarsest level that still has about
        `wanted` records there (finer levels after its last record), and each part's rows after its last
        level-0 record."""
        records, rests = [], []
        for index in self.files.values():
            for part in index.parts():
                if series in part.rest:
                    rests.append(part.rest[series])
                levels = part.levels(series)
                if not levels:
                    continue
                first, last = _window(levels[0], lo, hi)
                top = 0
                while top + 1 < len(levels) and (last - first) // FAN ** (top + 1) >= wanted:
                    top += 1
                start = 0
                for level in range(top, -1, -1):
                    array = levels[level]
                    first, last = _window(array, lo, hi, start)
                    if last > first:
                        chosen = np.array(array[first:last])
                        if not intact(chosen):
                            raise index.damaged(f"{series}.L{level}: a record's checksum fails")
                        records.append(chosen)
                    start = len(array) * FAN
        return records, rests


def _window(array: np.ndarray, lo: float, hi: float, start: int = 0) -> tuple[int, int]:
    """Records [first, last) of `array[start:]` (absolute numbers) whose span may overlap [lo, hi]."""
    if start >= len(array):
        return start, start
    view = array[start:]
    first = max(0, _bisect(view, "t_first", lo, "right") - 1)
    last = _bisect(view, "t_first", hi, "right")
    return start + first, start + max(first, last)
