"""A run read for its summary through its digest: what `rnnmon report` and the tab's summary read instead of the
run's large tables.

A `DigestReader` reads a run's documents and phases from the events the index's `dir.docs` lists (an index written
before it: a scan that parses only the events holding them), merges each event file's digest records
(`rnnmon.format.digest_file`), and adds the tables and documents of the events after the last record's `through`,
scanned from that byte on: its cost is the records, the listed events and the tail, not the run's rows. It keeps
what it read: a later `read` merges only the records appended since, digests the events after the last record
from where it stopped, and reads the documents of the new events only, so a live run's next summary costs its new
chunks, at any length (the tab keeps one per run; `read_run` is a fresh reader's one read, for `rnnmon report`).
Where a file has no index, or two files' steps overlap in time, `read` returns None (the caller reads the run
whole); where a digest disagrees with the data (a checksum, a `through` that is not an event's end or past the
file, step or gap counts the index's chunk directory does not hold, a listed event that is not whole), the run is
read whole, with a note: the data wins (and the next `read` starts afresh).

Example:
    >>> data = read_run("runs/exp1/rnnmon", "exp1/rnnmon")   # None: no index; read the run whole
    >>> summarize(data)                                       # data.digest stands for its tables
    >>> reader = DigestReader("runs/exp1/rnnmon", "exp1/rnnmon"); reader.read(); reader.read()  # new chunks only
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any

import numpy as np

from rnnmon.format import schema
from rnnmon.format.decode import BAD_DEVICE, Stored, decode_chunks, marked_event, stored_by, table_width
from rnnmon.format.digest import RunDigest
from rnnmon.format.digest_file import DigestMismatch, digested, read_records
from rnnmon.format.eventfile import EVENT_FILE_MARK, RecordCursor
from rnnmon.format.index import found_index_folder
from rnnmon.format.index_build import build_index
from rnnmon.format.index_located import IndexMismatch, devices_in, listed_documents, listed_through, read_directory
from rnnmon.format.index_read import FileIndex
from rnnmon.format.reader import RunData, RunReader

DOCUMENT_TAGS = frozenset({schema.RUN_TAG, schema.FINDINGS_TAG, schema.ALERTS_TAG, schema.SHAPES_TAG,
                           schema.COMPILES_TAG, schema.SHAPE_STEPS_TAG,
                           schema.PHASES_TAG})
_MARKS = tuple(tag.encode() for tag in (schema.STEPS_TAG, schema.GAPS_TAG, schema.UTIL_TAG_PREFIX,
                                        schema.STATS_TAG_PREFIX))


@dataclasses.dataclass
class _FileDigest:
    """What a `DigestReader` keeps of one event file: its digest records merged, the events after them digested so
    far, and where each of its reads stopped."""

    path: str
    records: RunDigest | None = None  # the digest records merged
    through: int = 0  # the event bytes they cover
    read_to: int = 0  # the digest file's bytes read
    counted: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # per chunk directory: records, rows
    tail: RunDigest = dataclasses.field(default_factory=RunDigest)  # the events from `through` to the cursor
    cursor: RecordCursor = dataclasses.field(default_factory=RecordCursor)
    started: bool = False  # read before: its listed documents taken, its tail begun
    fresh: bool = True  # the tail's cursor has not moved from `through`
    described: dict[str, Stored] = dataclasses.field(default_factory=dict)
    errors: list[str] = dataclasses.field(default_factory=list)  # chunks of the tail refused
    devices: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    first_time: float | None = None  # its first chunk's start (steps): where the file's steps begin
    head: FileIndex | None = None  # how the file describes each table: its first values' metadata


class DigestReader:
    """One run read for its summary, kept across reads (see the module)."""

    def __init__(self, run_dir: str, run: str) -> None:
        self.run_dir, self.run = run_dir, run
        self._files: dict[str, _FileDigest] = {}
        self._documents = RunReader(run, tags=DOCUMENT_TAGS)

    def read(self) -> RunData | None:
        """The run for a summary: its documents and phases, its large tables as a digest (`RunData.digest`); None
        where an event file has no index (read the run whole). Any failure in reading its index or digest reads the
        run whole, with a note: never an exception."""
        try:
            names = sorted(n for n in os.listdir(self.run_dir) if EVENT_FILE_MARK in n)
        except OSError:
            return None
        paths = [os.path.join(self.run_dir, n) for n in names]
        if not paths or not all(build_index(p) for p in paths):  # built once where a file has none
            return None
        try:
            if self._overlapping(paths):
                return None
            return self._read(paths)
        except Exception as error:  # a damaged index or digest of any kind: the data wins
            self._files, self._documents = {}, RunReader(self.run, tags=DOCUMENT_TAGS)  # afresh next time
            why = str(error) if isinstance(error, (DigestMismatch, IndexMismatch, OSError)) else (
                f"{type(error).__name__}: {error}")
            data = RunReader(self.run).update_from_files(self.run_dir)
            data.notes = [*data.notes, f"its digest disagrees with the data ({why}); read whole instead"]
            return data

    def _file(self, path: str) -> _FileDigest:
        name = os.path.basename(path)
        if name not in self._files:
            self._files[name] = _FileDigest(path, head=FileIndex(path))
        return self._files[name]

    def _overlapping(self, paths: list[str]) -> bool:
        """Event files whose steps overlap in time (writers in one folder before rnnmon's writer lock): their
        digests cannot be merged in file order, so the run is read whole (segments of one writer follow each
        other). Each file's first chunk is read once, its last at each read."""
        spans = []
        for path in paths:
            part = self._file(path)
            steps = os.path.join(found_index_folder(path), "dir.steps")
            try:
                size = os.path.getsize(path)
                if part.first_time is None:
                    first = read_directory(steps, size, limit=1)
                    part.first_time = float(first[0]["t_first"]) if len(first) else None
                last = read_directory(steps, size, last=True)
            except FileNotFoundError:
                continue
            if part.first_time is not None and len(last):
                spans.append((part.first_time, float(last[0]["t_last"])))
        spans.sort()
        return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))

    def _read(self, paths: list[str]) -> RunData:
        for path in paths:
            part = self._file(path)
            event_size = os.path.getsize(path)
            new, through, part.read_to = read_records(found_index_folder(path), event_size, part.read_to, part.through)
            if new is not None:
                if part.records is None:
                    part.records = new
                else:
                    part.records.merge(new)
                part.through = through
                _check_counts(part, event_size)
            if new is not None or not part.started:  # the tail starts at the records' end
                part.tail, part.cursor, part.fresh, part.errors = RunDigest(), RecordCursor(part.through), True, []
                if part.records is not None:  # the next steps may continue the records' last fit
                    part.tail.steps.fit_epoch = part.records.steps.fit_epoch
            if not part.started:  # its documents before the records' end: from the events `dir.docs` lists
                name = os.path.basename(path)
                found = listed_documents(path, part.through)
                if found is not None:
                    self._documents.update_from_records(name, found)
                    self._documents.start_at(name, part.through)
                part.started = True
            _tail(part)
            if not part.devices:
                part.devices = devices_in(path)
        data = self._documents.update_from_files(self.run_dir)  # the documents of the events not read yet
        digest, devices, errors = RunDigest(), {}, []
        for path in paths:
            part = self._files[os.path.basename(path)]
            if part.records is not None:
                digest.merge(part.records)
            digest.merge(part.tail)
            errors += part.errors
            for device, described in part.devices.items():
                devices.setdefault(device, described)
        data.digest = digest
        data.devices = {**devices, **data.devices}
        data.errors = [*data.errors, *errors]
        return data


def _check_counts(part: _FileDigest, event_size: int) -> None:
    """The digest's steps and gaps are the rows the index's chunk directory names before `through` (each
    directory read from where the last check stopped)."""
    folder = found_index_folder(part.path)
    counted = {"steps": 0, "gaps": 0}
    for name in os.listdir(folder):
        kind = "steps" if name == "dir.steps" else "gaps" if name.startswith("dir.gaps.") else None
        if kind is None:
            continue
        done = part.counted.setdefault(name, [0, 0])
        entries = read_directory(os.path.join(folder, name), event_size, start=done[0])
        before = entries["offset"] < part.through
        reached = len(before) if before.all() else int(np.argmin(before))
        if before[reached:].any():
            raise DigestMismatch(f"{name} names its chunks out of order")
        done[0] += reached
        done[1] += int(entries["rows"][:reached].sum())
        counted[kind] += done[1]
    digest = part.records
    if (counted["steps"], counted["gaps"]) != (digest.steps.rows, digest.gaps.rows):
        raise DigestMismatch(f"its digest holds {digest.steps.rows} steps and {digest.gaps.rows} gaps before byte "
                             f"{part.through}, the index names {counted['steps']} and {counted['gaps']}")


def _tail(part: _FileDigest) -> None:
    """Digest the tables of the events after those read, from the records' `through` on, into `part.tail`; its
    aggregates only where records stand for the rows before (the summary is then the aggregates'). Damage in these
    bytes is the documents reader's to name: it reads them too."""
    more = True
    while more:
        scan = part.cursor.scan(part.path)
        more = scan.more
        if scan.problem and part.fresh and part.cursor.offset == part.through and not scan.records:
            raise DigestMismatch(f"no event at byte {part.through}: {scan.problem}")
        part.fresh = part.fresh and not scan.records
        staged: dict[str, list[Any]] = {}
        for event in filter(None, (marked_event(record, _MARKS) for record in scan.records)):
            for value in event.summary.value:
                if digested(value.tag):
                    staged.setdefault(value.tag, []).append(value.tensor)
                    stored = stored_by(value)
                    if stored is not None:
                        part.described[value.tag] = stored
                elif table_width(value.tag) == BAD_DEVICE:  # as the reader names it
                    part.errors.append(f"{value.tag} at step {event.step}: not a device tag (expected a GPU index "
                                       "after 'gpu')")
        for tag, tensors in staged.items():
            rows, _, _, failed = decode_chunks(tag, tensors, part.described.get(tag) or part.head.stored(tag))
            part.errors += [f"{tag}: {error}" for _, error in failed]
            part.tail.add(tag, rows)
    if part.records is not None:
        part.tail.drop_rows()


def documents_reader(run_dir: str, run: str, tags: frozenset[str]) -> RunReader:
    """A reader of the documents `tags` of `run` (its run description: what /runs shows) that has read the events
    each event file's index lists and goes on reading each file from where its index ends, so a long run's first
    read costs its documents, not its rows. A file without an index, or one that disagrees with it, is read whole;
    damage in the bytes skipped is the timeline's and the summary's to find, which read them through the index."""
    reader = RunReader(run, tags=tags)
    try:
        names = sorted(n for n in os.listdir(run_dir) if EVENT_FILE_MARK in n)
    except OSError:
        return reader
    for name in names:
        path = os.path.join(run_dir, name)
        try:
            through = listed_through(path)
            records = listed_documents(path, through) if through else None
        except Exception:  # any failure of one file's index: that file is read whole
            continue
        if records is not None:
            reader.update_from_records(name, records)
            reader.start_at(name, through)
    return reader


def read_run(run_dir: str, run: str) -> RunData | None:
    """`run` for a summary, read once (`DigestReader.read`); None where an event file has no index."""
    return DigestReader(run_dir, run).read()
