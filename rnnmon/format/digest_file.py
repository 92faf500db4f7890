"""The digest records written beside the reading index (`rnnmon.format.digest`'s aggregates of a run's large tables).

`<run>/rnnmon-index/<event file's suffix>/digest` is a sequence of records: `through` (uint64 LE: the event file's
bytes the digests so far cover, ending at an event's end), the payload's length (uint32), the CRC-32 of those 12
bytes and the payload (uint32), then the payload: `RunDigest.dumps()` of the step, gap and GPU-sample chunks in the
events from the previous record's `through` to this one's (`DigestWriter`, fed by `IndexWriter` on the writer
thread, one record per `RECORD_STEPS` steps). A torn last record is dropped; a damaged one is a `DigestMismatch`.

Example:
    >>> digest, through, at = read_records(index_folder(event_path), os.path.getsize(event_path))
"""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from rnnmon.format import schema
from rnnmon.format.digest import RECORD_STEPS, RunDigest
from rnnmon.format.eventfile import open_regular

DIGEST_FILE = "digest"
MAX_RECORD_BYTES = 16 << 20  # a record's payload at most (a record of 8 GPUs is ~10 KB compressed)
_HEADER = struct.Struct("<QII")  # through, payload length, CRC-32 of both and the payload


class DigestMismatch(ValueError):
    """A digest record and its event file disagree: the run is read whole."""


def digested(tag: str) -> bool:
    return tag in (schema.STEPS_TAG, schema.GAPS_TAG) or (
        tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX)) and schema.device_of(tag) is not None)


class DigestWriter:
    """Digests the chunks an `IndexWriter` indexes and appends a record per `RECORD_STEPS` steps."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, DIGEST_FILE)
        self._digest = RunDigest()
        self._through = 0
        self._size = 0
        self._sealed: list[bytes] = []  # records not written yet

    def add_events(self, chunks: list[tuple[str, np.ndarray, int, int]]) -> None:
        """Chunks (tag, rows, offset of their event, its framed length) in file order, after those added before; a
        record is sealed at the first event after `RECORD_STEPS` steps (a record covers whole events). Each table's
        rows between two seals are digested at once."""
        pending: dict[str, list[np.ndarray]] = {}
        steps = self._digest.steps.rows
        for tag, rows, offset, length in chunks:
            if not digested(tag):
                continue
            if offset >= self._through and steps >= RECORD_STEPS:
                self._add(pending)
                self._seal()
                pending, steps = {}, 0
            pending.setdefault(tag, []).append(rows)
            steps += len(rows) if tag == schema.STEPS_TAG else 0
            self._through = max(self._through, offset + length)
        self._add(pending)

    def _add(self, pending: dict[str, list[np.ndarray]]) -> None:
        for tag, parts in pending.items():
            self._digest.add(tag, parts[0] if len(parts) == 1 else np.concatenate(parts))

    def _seal(self) -> None:
        if self._digest.steps.rows < RECORD_STEPS:
            return
        payload = self._digest.dumps()
        header = struct.pack("<QI", self._through, len(payload))
        self._sealed.append(header + struct.pack("<I", zlib.crc32(payload, zlib.crc32(header))) + payload)
        carried = self._digest.steps.fit_epoch
        self._digest = RunDigest()
        self._digest.steps.fit_epoch = carried  # the next steps may continue the same fit's first epoch

    def flush(self) -> None:
        """Append the sealed records, once the events they cover are whole in the file (OSError: the caller
        abandons the index)."""
        self._seal()
        if not self._sealed:
            return
        data, self._sealed = b"".join(self._sealed), []
        try:
            with open(self.path, "ab", buffering=0) as out:
                view = memoryview(data)
                while view:
                    view = view[out.write(view):]
        except OSError:
            with open(self.path, "ab") as out:  # no torn record left for the next append to shift
                out.truncate(self._size)
            raise
        self._size += len(data)


def covered_through(folder: str, event_size: int) -> int:
    """The bytes of events the index in `folder` is whole through, by its digest's last record: the writer appends
    every chunk directory and pyramid record of a flush before the digest record sealed in it (and the uploader
    uploads the digest after them), so every series' directory lists each chunk of that series below `through`.
    Read from the records' headers and the last record's checksum; 0 where the digest says nothing sure."""
    try:
        fd = open_regular(os.path.join(folder, DIGEST_FILE))
    except OSError:
        return 0
    with os.fdopen(fd, "rb") as file:
        size, at, last = os.fstat(fd).st_size, 0, None
        while at + _HEADER.size <= size:
            file.seek(at)
            through, length, _ = _HEADER.unpack(file.read(_HEADER.size))
            if length > MAX_RECORD_BYTES or at + _HEADER.size + length > size:
                break
            last, at = at, at + _HEADER.size + length
        if last is None:
            return 0
        file.seek(last)
        header = file.read(_HEADER.size)
        through, length, crc = _HEADER.unpack(header)
        payload = file.read(length)
    intact = zlib.crc32(payload, zlib.crc32(header[:12])) == crc
    return through if intact and through <= event_size else 0


def read_records(folder: str, event_size: int, at: int = 0, through: int = 0) -> tuple[RunDigest | None, int, int]:
    """The digest records in the index `folder` of an event file of `event_size` bytes from byte `at` of the digest
    file (0: all; a kept reader passes where the last call stopped, and the `through` it reached), merged; the
    bytes of events they reach; and where reading stopped (before a torn last record). (None, `through`, `at`)
    where there are none; DigestMismatch where the file cannot be read (not a regular file: it is opened as event
    files are), was cut below `at`, or a record is damaged, longer than `MAX_RECORD_BYTES`, goes back, or disagrees
    with the event file. Read a record at a time: what is held is the merged digest and one record."""
    path = os.path.join(folder, DIGEST_FILE)
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        if at:
            raise DigestMismatch("its digest was removed after it was read") from None
        return None, through, at
    except OSError as error:
        raise DigestMismatch(f"cannot read its digest: {error.strerror or error}") from None
    merged = None
    try:
        size = os.fstat(fd).st_size
        if size < at:
            raise DigestMismatch(f"its digest was cut below byte {at}, read before")
        while at + _HEADER.size <= size:
            header = os.pread(fd, _HEADER.size, at)
            if len(header) < _HEADER.size:
                break  # cut while read
            end, length, crc = _HEADER.unpack(header)
            if length > MAX_RECORD_BYTES:
                raise DigestMismatch(f"a digest record at byte {at} claims {length} bytes")
            payload = os.pread(fd, length, at + _HEADER.size)
            if len(payload) < length:
                break  # a torn last record: the writer is writing it, or died
            if zlib.crc32(payload, zlib.crc32(header[:12])) != crc:
                raise DigestMismatch(f"a digest record's checksum fails at byte {at}")
            if end < through:
                raise DigestMismatch(f"a digest record goes back to byte {end}")
            try:
                digest = RunDigest.loads(payload)
            except ValueError as error:
                raise DigestMismatch(f"a digest record at byte {at} is not one: {error}") from None
            if merged is None:
                merged = digest
            else:
                merged.merge(digest)
            through, at = end, at + _HEADER.size + length
    finally:
        os.close(fd)
    if merged is not None and through > event_size:
        raise DigestMismatch(f"its digest covers {through} bytes of events, the event file holds fewer")
    return merged, through, at
