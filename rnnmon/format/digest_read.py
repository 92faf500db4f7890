"""A run read for its summary through its digest: what `rnnmon report` and the tab's summary read instead of the
run's large tables.

`read_run` reads a run's documents and phases from the events the index's `dir.docs` lists (an index written
before it: a scan that parses only the events holding them), merges each event file's digest records
(`rnnmon.format.digest_file`), and adds the tables and documents of the events after the last record's `through`,
scanned from that byte on: its cost is the records, the listed events and the tail, not the run's rows. Where a
file has no index, or two files' steps overlap in time, `read_run` returns None (the caller reads the run whole);
where a digest disagrees with the data (a checksum, a `through` that is not an event's end or past the file, step
or gap counts the index's chunk directory does not hold, a listed event that is not whole), the run is read whole,
with a note: the data wins.

Example:
    >>> data = read_run("runs/exp1/rnnmon", "exp1/rnnmon")   # None: no index; read the run whole
    >>> summarize(data)                                       # data.digest stands for its tables
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from rnnmon.format import schema
from rnnmon.format.decode import Stored, decode_chunks, marked_event, stored_by
from rnnmon.format.digest import RunDigest
from rnnmon.format.digest_file import DigestMismatch, digested, read_records
from rnnmon.format.eventfile import EVENT_FILE_MARK, TAIL_GRACE_S, RecordCursor
from rnnmon.format.index import index_folder
from rnnmon.format.index_read import (
    FileIndex,
    IndexMismatch,
    devices_in,
    listed_documents,
    listed_through,
    read_directory,
)
from rnnmon.format.reader import RunData, RunReader

DOCUMENT_TAGS = frozenset({schema.RUN_TAG, schema.FINDINGS_TAG, schema.ALERTS_TAG, schema.SHAPES_TAG,
                           schema.COMPILES_TAG, schema.SHAPE_STEPS_TAG,
                           schema.PHASES_TAG})
_MARKS = tuple(tag.encode() for tag in (schema.STEPS_TAG, schema.GAPS_TAG, schema.UTIL_TAG_PREFIX,
                                        schema.STATS_TAG_PREFIX))


def _check_counts(event_path: str, digest: RunDigest, through: int) -> None:
    """The digest's steps and gaps are the rows the index's chunk directory names before `through`."""
    folder = index_folder(event_path)
    counted = {"steps": 0, "gaps": 0}
    event_size = os.path.getsize(event_path)
    for name in os.listdir(folder):
        kind = "steps" if name == "dir.steps" else "gaps" if name.startswith("dir.gaps.") else None
        if kind is None:
            continue
        entries = read_directory(os.path.join(folder, name), event_size)
        counted[kind] += int(entries["rows"][entries["offset"] < through].sum())
    if (counted["steps"], counted["gaps"]) != (digest.steps.rows, digest.gaps.rows):
        raise DigestMismatch(f"its digest holds {digest.steps.rows} steps and {digest.gaps.rows} gaps before byte "
                             f"{through}, the index names {counted['steps']} and {counted['gaps']}")


def _tail(event_path: str, through: int, digest: RunDigest, documents: RunReader | None,
          errors: list[str]) -> None:
    """Add the tables of the events from byte `through` on to `digest`, and their documents to `documents`."""
    cursor, more = RecordCursor(through), True
    name = os.path.basename(event_path)
    head = FileIndex(event_path)  # how the file describes each table: its first values' metadata
    described: dict[str, Stored] = {}
    while more:
        scan = cursor.scan(event_path)
        more = scan.more
        if scan.problem:
            if cursor.offset == through and not scan.records:
                raise DigestMismatch(f"no event at byte {through}: {scan.problem}")
            errors.append(f"{name}: {scan.problem}")
        if scan.truncated and time.time() - scan.modified > TAIL_GRACE_S:
            errors.append(f"{name}: truncated: the file ends inside the record at byte {scan.offset}")
        if documents is not None:
            documents.update_from_records(name, scan.records)
        staged: dict[str, list[Any]] = {}
        for event in filter(None, (marked_event(record, _MARKS) for record in scan.records)):
            for value in event.summary.value:
                if digested(value.tag):
                    staged.setdefault(value.tag, []).append(value.tensor)
                    stored = stored_by(value)
                    if stored is not None:
                        described[value.tag] = stored
        for tag, tensors in staged.items():
            rows, _, _, failed = decode_chunks(tag, tensors, described.get(tag) or head.stored(tag))
            errors += [f"{tag}: {error}" for _, error in failed]
            digest.add(tag, rows)


def _overlapping(paths: list[str]) -> bool:
    """Event files whose steps overlap in time (writers in one folder before rnnmon's writer lock): their digests
    cannot be merged in file order, so the run is read whole (segments of one writer follow each other)."""
    spans = []
    for path in paths:
        try:
            entries = read_directory(os.path.join(index_folder(path), "dir.steps"), os.path.getsize(path))
        except FileNotFoundError:
            continue
        if len(entries):  # (a run's dir.steps is small: one record per flush, 44 bytes)
            spans.append((float(entries[0]["t_first"]), float(entries[-1]["t_last"])))
    spans.sort()
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


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
    """`run` for a summary: its documents and phases (the events `dir.docs` lists, then those after the digest),
    its large tables as a digest (`RunData.digest`); None where an event file has no index (read the run whole).
    Any failure in reading its index or digest reads the run whole, with a note: never an exception."""
    try:
        names = sorted(n for n in os.listdir(run_dir) if EVENT_FILE_MARK in n)
    except OSError:
        return None
    paths = [os.path.join(run_dir, n) for n in names]
    if not paths or not all(os.path.isdir(index_folder(p)) for p in paths):
        return None
    try:
        if _overlapping(paths):
            return None
        return _read_indexed(run_dir, run, paths)
    except Exception as error:  # a damaged index or digest of any kind: the data wins
        why = str(error) if isinstance(error, (DigestMismatch, IndexMismatch, OSError)) else (
            f"{type(error).__name__}: {error}")
        data = RunReader(run).update_from_files(run_dir)
        data.notes = [*data.notes, f"its digest disagrees with the data ({why}); read whole instead"]
        return data


def _read_indexed(run_dir: str, run: str, paths: list[str]) -> RunData:
    digest, errors, devices = RunDigest(), [], {}
    documents = RunReader(run, tags=DOCUMENT_TAGS)
    parts = []
    for path in paths:
        part, through = read_records(index_folder(path), os.path.getsize(path))
        if part is not None:
            _check_counts(path, part, through)
        parts.append((path, part or RunDigest(), through, listed_documents(path, through)))
    listed = all(found is not None for *_, found in parts)  # else: an index from before dir.docs
    for path, part, through, found in parts:
        if listed:
            documents.update_from_records(os.path.basename(path), found)
        _tail(path, through, part, documents if listed else None, errors)
        digest.merge(part)
        for device, described in devices_in(path).items():
            devices.setdefault(device, described)
    data = documents.data() if listed else documents.update_from_files(run_dir)
    data.digest = digest
    data.devices = {**devices, **data.devices}
    data.errors = [*data.errors, *errors]
    return data
