"""A run read for its summary through its digest: what `rnnmon report` and the tab's summary read instead of the
run's large tables.

`read_run` reads a run's documents and phases from its event files (a scan that parses only the events holding
them), merges each file's digest records (`rnnmon.format.digest_file`), and adds the tables of the events after the
last record's `through`, scanned from that byte on: its cost is the records plus the tail, not the run's rows.
Where a file has no index, `read_run` returns None (the caller reads the run whole); where a digest disagrees with
the data (a checksum, a `through` that is not an event's end or past the file, step or gap counts the index's chunk
directory does not hold), the run is read whole, with a note: the data wins.

Example:
    >>> data = read_run("runs/exp1/rnnmon", "exp1/rnnmon")   # None: no index; read the run whole
    >>> summarize(data)                                       # data.digest stands for its tables
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rnnmon.format import schema
from rnnmon.format.digest import RunDigest
from rnnmon.format.digest_file import DigestMismatch, digested, read_records
from rnnmon.format.eventfile import EVENT_FILE_MARK, RecordCursor
from rnnmon.format.index import DIRECTORY, devices_in, index_folder
from rnnmon.format.reader import RunData, RunReader, decode_chunks

DOCUMENT_TAGS = frozenset({schema.RUN_TAG, schema.FINDINGS_TAG, schema.ALERTS_TAG, schema.SHAPES_TAG,
                           schema.PHASES_TAG})
_MARKS = tuple(tag.encode() for tag in (schema.STEPS_TAG, schema.GAPS_TAG, schema.UTIL_TAG_PREFIX,
                                        schema.STATS_TAG_PREFIX))


def _check_counts(event_path: str, digest: RunDigest, through: int) -> None:
    """The digest's steps and gaps are the rows the index's chunk directory names before `through`."""
    folder = index_folder(event_path)
    counted = {"steps": 0, "gaps": 0}
    for name in os.listdir(folder):
        kind = "steps" if name == "dir.steps" else "gaps" if name.startswith("dir.gaps.") else None
        if kind is None:
            continue
        with open(os.path.join(folder, name), "rb") as file:
            raw = file.read()
        entries = np.frombuffer(raw, dtype=DIRECTORY, count=len(raw) // DIRECTORY.itemsize)
        counted[kind] += int(entries["rows"][entries["offset"] < through].sum())
    if (counted["steps"], counted["gaps"]) != (digest.steps.rows, digest.gaps.rows):
        raise DigestMismatch(f"its digest holds {digest.steps.rows} steps and {digest.gaps.rows} gaps before byte "
                             f"{through}, the index names {counted['steps']} and {counted['gaps']}")


def _tail(event_path: str, through: int, digest: RunDigest, errors: list[str]) -> None:
    """Add to `digest` the tables of the events from byte `through` on."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    cursor, more = RecordCursor(through), True
    name = os.path.basename(event_path)
    while more:
        scan = cursor.scan(event_path)
        more = scan.more
        if scan.problem:
            if cursor.offset == through and not scan.records:
                raise DigestMismatch(f"no event at byte {through}: {scan.problem}")
            errors.append(f"{name}: {scan.problem}")
        staged: dict[str, list[Any]] = {}
        for record in scan.records:
            if not any(mark in record for mark in _MARKS):
                continue
            try:
                event = event_pb2.Event.FromString(record)
            except DecodeError:
                continue
            for value in event.summary.value:
                if digested(value.tag):
                    staged.setdefault(value.tag, []).append(value.tensor)
        for tag, tensors in staged.items():
            rows, _, _, failed = decode_chunks(tag, tensors)
            errors += [f"{tag}: {error}" for _, error in failed]
            digest.add(tag, rows)


def read_run(run_dir: str, run: str, documents: RunReader | None = None) -> RunData | None:
    """`run` for a summary: its documents and phases read (by `documents`, a `RunReader` of `DOCUMENT_TAGS` kept
    from an earlier call: then only new bytes), its large tables as a digest (`RunData.digest`); None where an event
    file has no index (read the run whole)."""
    try:
        names = sorted(n for n in os.listdir(run_dir) if EVENT_FILE_MARK in n)
    except OSError:
        return None
    paths = [os.path.join(run_dir, n) for n in names]
    if not paths or not all(os.path.isdir(index_folder(p)) for p in paths):
        return None
    digest, errors, devices = RunDigest(), [], {}
    try:
        for path in paths:
            part, through = read_records(index_folder(path), os.path.getsize(path))
            if part is not None:
                _check_counts(path, part, through)
            else:
                part = RunDigest()
            _tail(path, through, part, errors)
            digest.merge(part)
            for device, described in devices_in(path).items():
                devices.setdefault(device, described)
    except (DigestMismatch, OSError) as error:
        data = RunReader(run).update_from_files(run_dir)
        data.notes = [*data.notes, f"its digest disagrees with the data ({error}); read whole instead"]
        return data
    data = (documents or RunReader(run, tags=DOCUMENT_TAGS)).update_from_files(run_dir)
    data.digest = digest
    data.devices = {**devices, **data.devices}
    data.errors = [*data.errors, *errors]
    return data

