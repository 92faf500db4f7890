"""Reading one event file's index (`rnnmon.format.index` says what its files are): `FileIndex` maps the index on
disk as far as the data agrees with it and indexes the event file's later bytes in memory; and the checked reads
the digest's reader shares (a chunk directory, the listed document events, one located chunk, the GPUs a file
describes).

Example:
    >>> index = FileIndex(event_path)
    >>> index.refresh()                            # new index records and new event bytes only
    >>> [part.levels("steps") for part in index.parts()]
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rnnmon.format import schema
from rnnmon.format.decode import Stored, decode_chunks, marked_event, stored_by
from rnnmon.format.digest_file import covered_through
from rnnmon.format.eventfile import TAIL_GRACE_S, RecordCursor, masked_crc32c, open_regular, truncated_at
from rnnmon.format.index import (
    DIRECTORY,
    DOCUMENTS,
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
from rnnmon.format.index_write import IndexBuilder

HEAD_STEP_BYTES = 64 << 10  # a file's head is read this much at a time, until what is looked for is found
SCAN_BYTES = 1 << 20  # event bytes indexed in memory at a time (a run without an index): ~4 MB of rows at once
READ_BYTES = 1 << 20  # index file bytes read at a time
_MARKS = tuple(tag.encode() for tag in (schema.STEPS_TAG, schema.PHASES_TAG, schema.GAPS_TAG, schema.UTIL_TAG_PREFIX,
                                        schema.STATS_TAG_PREFIX))


# --- one event file ----------------------------------------------------------------------------------------
class IndexMismatch(ValueError):
    """The index and its event file disagree: the index is not used."""


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


def read_directory(path: str, event_size: int, last: bool = False, start: int = 0,
                   limit: int | None = None) -> np.ndarray:
    """The whole records of the chunk directory (`dir.*`) at `path` from record `start` on, at most `limit` of them
    (with `last`, the last one only), read as event files are read: a regular file only, opened non-blocking, its
    size taken from the descriptor. IndexMismatch where it cannot be read, or names more events than an event file
    of `event_size` bytes can hold (a huge sparse file is refused before any read); FileNotFoundError where there is
    none."""
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
        first = count - 1 if last and count else min(start, count)
        wanted = (count - first if limit is None else min(limit, count - first)) * DIRECTORY.itemsize
        data = bytearray()
        while len(data) < wanted:
            piece = os.pread(fd, min(READ_BYTES, wanted - len(data)), first * DIRECTORY.itemsize + len(data))
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


def listed_documents(event_path: str, through: int) -> list[bytes] | None:
    """The records of the events `dir.docs` lists before byte `through`, each checked (framing, both checksums,
    each after the one before); None where the index has no `dir.docs` (written before it: scan the file instead);
    IndexMismatch where `dir.docs` cannot be read or a listed event is not whole."""
    try:
        event_size = os.path.getsize(event_path)
        entries = read_directory(os.path.join(found_index_folder(event_path), DOCUMENTS), event_size)
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
    folder = found_index_folder(event_path)
    try:
        names = [name for name in os.listdir(folder)
                 if name == DOCUMENTS or (name.startswith("dir.") and INDEX_FILE.fullmatch(name))]
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


def read_chunks(path: str, entries: np.ndarray | list[np.void], tag: str,
                stored: Stored | None = None) -> list[np.ndarray]:
    """The rows of `tag` in each event `entries` (directory records) name, each checked: framing, both checksums,
    event step, the tag; then decoded and checked together (one call of `decode_chunks`, as a scan decodes them).
    IndexMismatch at the first that fails."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    if not len(entries):
        return []
    entries = np.array(entries, dtype=DIRECTORY) if isinstance(entries, list) else entries
    try:
        fd = open_regular(path)
    except OSError as error:
        raise IndexMismatch(f"cannot read the event file: {error.strerror or error}") from None
    tensors, steps = [], []
    try:
        for offset, length, step in zip(*(entries[field].tolist() for field in ("offset", "length", "step"))):
            if length < 16:
                raise IndexMismatch(f"no event located for step {step}")
            data = os.pread(fd, length, offset)
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
            value = next((value for value in event.summary.value if value.tag == tag), None)
            if value is None:
                raise IndexMismatch(f"the event at byte {offset} holds no {tag}")
            tensors.append(value.tensor)
            steps.append(step)
    finally:
        os.close(fd)
    rows, counts, _, failed = decode_chunks(tag, tensors, stored)
    if failed:
        first, error = failed[0]
        raise IndexMismatch(f"{tag} at step {steps[first]}: {error}")
    return np.split(rows, np.cumsum(counts)[:-1]) if len(counts) > 1 else [rows]


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
