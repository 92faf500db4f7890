"""Checked reads of what a reading index locates in an event file and beside it, shared by `FileIndex`
(`rnnmon.format.index_read`) and the digest's reader (`rnnmon.format.digest_read`): a chunk directory, the document
events `dir.docs` lists, the chunks a directory names, a file's head and the GPUs it describes. Every read is of a
regular file only (`open_regular`) and checked (framing, checksums, event step, tag); a disagreement is an
`IndexMismatch`: the index is set aside, the data wins.

Example:
    >>> entries = read_directory(os.path.join(found_index_folder(path), "dir.steps"), os.path.getsize(path))
    >>> [rows.shape for rows in read_chunks(path, entries[-3:], schema.STEPS_TAG)]
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from rnnmon.format import schema
from rnnmon.format.decode import Stored, decode_chunks
from rnnmon.format.eventfile import RecordCursor, masked_crc32c, open_regular
from rnnmon.format.index import DIRECTORY, DOCUMENTS, INDEX_FILE, MIN_EVENT_BYTES, found_index_folder, intact

HEAD_STEP_BYTES = 64 << 10  # a file's head is read this much at a time, until what is looked for is found
READ_BYTES = 1 << 20  # index file bytes read at a time


class IndexMismatch(ValueError):
    """The index and its event file disagree: the index is not used."""


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
