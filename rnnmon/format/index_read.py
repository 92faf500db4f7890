"""Reading one event file's index (`rnnmon.format.index` says what its files are): `FileIndex` maps the index on
disk as far as the data agrees with it and indexes the event file's later bytes in memory (each read of what the
index locates checked: `rnnmon.format.index_located`).

Example:
    >>> index = FileIndex(event_path)
    >>> index.refresh()                            # new index records and new event bytes only
    >>> [part.levels("steps") for part in index.parts()]
"""

from __future__ import annotations

import bisect
import dataclasses
import mmap
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rnnmon.format import schema
from rnnmon.format.decode import Stored, decode_chunks, marked_event, stored_by
from rnnmon.format.digest_file import covered_through
from rnnmon.format.eventfile import TAIL_GRACE_S, RecordCursor, open_regular, truncated_at
from rnnmon.format.index import (
    INDEX_FILE,
    MIN_EVENT_BYTES,
    dir_name,
    drawn,
    dtype_of,
    empty_series,
    found_index_folder,
    intact,
    only_series,
    series_of,
    tag_of,
)
from rnnmon.format.index_located import IndexMismatch, head_records, read_chunks
from rnnmon.format.index_write import IndexBuilder

SCAN_BYTES = 1 << 20  # event bytes indexed in memory at a time (a run without an index): ~4 MB of rows at once
_MARKS = tuple(tag.encode() for tag in (schema.STEPS_TAG, schema.PHASES_TAG, schema.GAPS_TAG, schema.UTIL_TAG_PREFIX,
                                        schema.STATS_TAG_PREFIX))


# --- one event file ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Part:
    """A stretch of one event file's index: record arrays by file name, and per series the rows after its last
    level-0 record (time, key, values) or (start, end): held in `rest`, or (the disk index's) read from the event
    file by `reader` the first time `rest_of` is asked for them, since a window drawn from the chunks themselves
    (a short one, intervals listed one by one) never needs them."""

    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    rest: dict[str, tuple[np.ndarray, ...]] = dataclasses.field(default_factory=dict)
    mapped: frozenset[str] = frozenset()  # arrays mapped from the index files: the page cache's, not memory held
    unread: set[str] = dataclasses.field(default_factory=set)  # series whose rest `reader` reads when asked
    reader: Callable[[Part, str], tuple[np.ndarray, ...]] | None = None

    def rest_of(self, series: str) -> tuple[np.ndarray, ...] | None:
        """The rows of `series` after its last level-0 record; None where this part has none."""
        if series in self.unread and self.reader is not None:
            self.rest[series] = self.reader(self, series)
            self.unread.discard(series)
        return self.rest.get(series)

    def rest_series(self) -> set[str]:
        return set(self.rest) | self.unread

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
        self.folder = found_index_folder(event_path)
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
                                    if INDEX_FILE.fullmatch(e.name) and e.is_file()))
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
        """Map the index files (whole records only) and check them against the event file; the rows after each
        series' last level-0 record are read when a view first draws from its pyramid (`Part.rest_of`). Each
        series is read from the index as far as its chunk directory reaches, and from the event file after that:
        the scan starts at the directory that reaches least (a lagging file: an upload pass that failed midway),
        or where the digest's last record says every directory is whole (`covered_through`), whichever is later:
        a series that simply stopped (the warm-up phase, a gap cause seen early) ends its directory early, and a
        scan from there read every such run whole. The scan decodes no chunk of a one-series tag its directory
        names (`_listed`). A series whose directory is lost is read from the event file whole (its pyramid set
        aside, with a note)."""
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
            self.notes.append(f"{os.path.basename(self.path)}: its reading index lacks {dir_name(series)}; "
                              f"{series} is read from the event file instead")
            arrays = {name: array for name, array in arrays.items() if name.rsplit(".L", 1)[0] != series}
        last_time = {}
        for name, array in arrays.items():  # the last chunk of each series is where the index says, as it says
            if name.startswith("dir."):
                rows = self._chunk(array[-1], tag_of(name[4:]))
                times = [parts[0] for found, parts in series_of(tag_of(name[4:]), rows) if found == name[4:]]
                last_time[name[4:]] = float(times[0].max()) if times and len(times[0]) else -np.inf
        for name in list(arrays):  # a pyramid ahead of its directory: only the records the directory covers
            series = name.rsplit(".L", 1)[0]
            if not name.startswith("dir.") and series in last_time:
                arrays[name] = arrays[name][:bisect_field(arrays[name], "t_last", last_time[series], "right")]
        self.disk = Part(arrays, mapped=frozenset(arrays), reader=self._read_rest,
                         unread={name[4:] for name in arrays if name.startswith("dir.")})
        start = min(reach.values(), default=0)
        whole_through = covered_through(self.folder, event_size) if reach else 0  # the digest's last record
        self._restart(0 if lost else max(start, min(whole_through, end)), reach)

    def _read_rest(self, part: Part, series: str) -> tuple[np.ndarray, ...]:
        """`_rest_of`, read when first asked for; a disagreement stops the disk index's use (and raises)."""
        try:
            return self._rest_of(part, series)
        except IndexMismatch as error:
            raise self.damaged(str(error)) from None
        except Exception as error:  # any other failure of the index: the data wins, with a note
            raise self.damaged(f"{type(error).__name__}: {error}") from None

    def _rest_of(self, part: Part, series: str) -> tuple[np.ndarray, ...]:
        """The rows of `series` after its last level-0 record, read from the chunks its directory names."""
        tag = tag_of(series)
        directory = part.arrays[dir_name(series)]
        level0 = part.arrays.get(f"{series}.L0")
        interval = series.startswith(("gaps.", "phases."))
        after = -np.inf if level0 is None else float(level0[-1]["s_last" if interval else "t_last"])
        chunk = np.array(directory[bisect_field(directory, "t_last", after, "right"):])
        if not intact(chunk):
            raise IndexMismatch(f"{dir_name(series)}: a record's checksum fails")
        pieces = [empty_series(series)]
        for rows in read_chunks(self.path, chunk, tag, self.stored(tag)):
            for name, parts in series_of(tag, rows):
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
                            if scan.problem is None and self._listed(value.tag, position):
                                continue
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

    def _listed(self, tag: str, position: int) -> bool:
        """A chunk of a one-series tag at `position` that the disk index's directory names: its rows are there
        (the builder takes none before `since`), so it is not decoded."""
        series = only_series(tag)
        return series is not None and position < self._builder.since.get(series, 0)

    def _learn(self, value: Any) -> None:
        """Keep how a value's metadata describes its tag (its first value in the file carries it)."""
        stored = stored_by(value)
        if stored is not None:
            self._stored[value.tag] = stored

    def stored(self, tag: str) -> Stored | None:
        """How this file describes `tag`: learnt from its records, or from its first `SCAN_BYTES` where the scan
        started past them (a disk index), read only as far as the tag's first value; None (as this reader writes
        it) where they do not say."""
        while tag not in self._stored:  # (each batch taken from the head is read: none once the tag is known)
            records = next(self._head, None)
            if records is None:
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
        return read_chunks(self.path, [entry], tag, self.stored(tag))[0]

    def read(self, entries: list[np.void], tag: str) -> list[np.ndarray]:
        """The rows of `tag` in each chunk `entries` name, read and decoded together; a disagreement stops the disk
        index's use (and raises)."""
        try:
            return read_chunks(self.path, entries, tag, self.stored(tag))
        except IndexMismatch as error:
            raise self.damaged(str(error)) from None


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


class _Field:
    """One field of a record array as a sequence, read record by record (a memmap stays unread)."""

    def __init__(self, array: np.ndarray, field: str) -> None:
        self.array, self.field = array, field

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> float:
        return float(self.array[i][self.field])


def bisect_field(array: np.ndarray, field: str, value: float, side: str) -> int:
    """`np.searchsorted` on one field of a record array, touching only log(n) records."""
    return (bisect.bisect_left if side == "left" else bisect.bisect_right)(_Field(array, field), value)
