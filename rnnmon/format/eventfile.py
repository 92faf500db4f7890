"""TensorBoard event files at the record level: append records, and walk them back with every checksum checked.

An event file is a sequence of TFRecords: `length` (uint64 LE), the masked CRC-32C of those 8 bytes, `length`
bytes of a serialized `Event`, and the masked CRC-32C of the data. Reading and writing here needs no TensorFlow
(TensorBoard's own writer and reader import it when it is installed: 2.5 s), and the walk is what tells a
truncated or bit-flipped file from a good one, which TensorBoard's data provider does not say.

Example:
    >>> with EventFileAppender("runs/exp1/rnnmon") as out:
    ...     out.add(event.SerializeToString())
    ...     out.flush()
    >>> scan = scan_records(out.path)
    >>> len(scan.records), scan.problem
    (1, None)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import os
import socket
import struct
import threading
import time
from types import TracebackType

try:  # the C implementation: ~2 GB/s
    from google_crc32c import value as _crc32c
except ImportError:  # pragma: no cover - the pure-Python fallback, ~10 MB/s
    _crc32c = None

MAX_RECORD_BYTES = 32 << 20  # no rnnmon record comes near this; a longer length is damage, not data
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_uid_lock = threading.Lock()
_uid = 0

EVENT_FILE_MARK = "tfevents"  # in the name of every TensorBoard event file


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_TABLE = _crc_table() if _crc32c is None else []


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`."""
    if _crc32c is not None:
        return _crc32c(data)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The TFRecord checksum: CRC-32C rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One TFRecord holding `data`."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


@dataclasses.dataclass
class Scan:
    """What `scan_records` found: the good records, where reading stopped, and what was wrong, if anything."""

    records: list[bytes]
    offset: int  # the byte after the last whole record read (resume here)
    problem: str | None = None  # damage: a checksum mismatch or an impossible length
    truncated: bool = False  # the file ends inside a record (a crash mid-write, a partial copy, or a live writer)


def scan_records(path: str, offset: int = 0, max_record_bytes: int = MAX_RECORD_BYTES) -> Scan:
    """Every whole, checksummed record of the file at `path` from `offset` on.

    A record whose data checksum fails is skipped and named in `problem`; a length whose checksum fails, or
    that exceeds `max_record_bytes`, ends the walk there (nothing after it can be framed). A file that ends
    inside a record sets `truncated`; `offset` stays before that record, so a reader can come back for it.
    """
    records: list[bytes] = []
    problems: list[str] = []
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    position, end = 0, len(data)
    truncated = False
    crc, header, footer = _crc32c or crc32c, _HEADER.unpack_from, _FOOTER.unpack_from  # the loop runs per record
    while position < end:
        if end - position < _HEADER.size:
            truncated = True
            break
        length, length_crc = header(data, position)
        check = crc(data[position:position + 8])
        if (((check >> 15) | (check << 17)) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:  # masked_crc32c, inlined
            problems.append(f"corrupt record header at byte {offset + position} "
                            f"({end - position} bytes after it unreadable)")
            break
        if length > max_record_bytes:
            problems.append(f"record at byte {offset + position} claims {length} bytes, over the "
                            f"{max_record_bytes}-byte limit ({end - position} bytes after it unreadable)")
            break
        stop = position + _HEADER.size + length + _FOOTER.size
        if stop > end:
            truncated = True
            break
        payload = data[position + _HEADER.size:stop - _FOOTER.size]
        check = crc(payload)
        if (((check >> 15) | (check << 17)) + _MASK_DELTA) & 0xFFFFFFFF != footer(data, stop - _FOOTER.size)[0]:
            problems.append(f"corrupt record at byte {offset + position} (data checksum mismatch; skipped)")
        else:
            records.append(payload)
        position = stop
    return Scan(records, offset + position, "; ".join(problems) or None, truncated)


class EventFileAppender:
    """A new event file in `directory`, named as TensorBoard names them; records are written on `flush()`.

    Records not yet written are kept in memory, the oldest dropped beyond `max_pending_bytes`. Not thread-safe:
    the caller holds a lock (SummaryWriter does).
    """

    def __init__(self, directory: str, max_pending_bytes: int = 64 << 20) -> None:
        global _uid
        with _uid_lock:
            _uid += 1
            uid = _uid
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{uid}"
        self.path = os.path.join(directory, name)
        self._max_pending_bytes = max_pending_bytes
        self._pending: collections.deque[bytes] = collections.deque()
        self._pending_bytes = 0
        self.dropped = 0  # records dropped unwritten since the last successful flush
        self._file = self._open()

    def _open(self) -> io.FileIO:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        return io.FileIO(self.path, "a")  # unbuffered: a failed write leaves nothing behind to write later

    def add(self, record: bytes) -> None:
        self._pending.append(record)
        self._pending_bytes += len(record)
        while self._pending_bytes > self._max_pending_bytes and len(self._pending) > 1:
            self._pending_bytes -= len(self._pending.popleft())
            self.dropped += 1

    def lost(self) -> bool:
        """The file was deleted (or its folder) since it was opened: what is written now would vanish."""
        try:
            return os.fstat(self._file.fileno()).st_nlink == 0 or not os.path.exists(self.path)
        except (OSError, ValueError):
            return True

    def reopen(self) -> list[bytes]:
        """Start the file again at its path (recreating its folder); returns the records not yet written."""
        with contextlib.suppress(OSError, ValueError):
            self._file.close()
        pending = list(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self._file = self._open()
        return pending

    def flush(self) -> None:
        """Write the queued records; on failure cut the file back to its last whole record, keep them queued."""
        if not self._pending:
            return
        good = os.fstat(self._file.fileno()).st_size
        data = memoryview(b"".join(frame(record) for record in self._pending))
        try:
            while data:
                data = data[self._file.write(data):]
        except OSError:
            with contextlib.suppress(OSError, ValueError):
                self._file.truncate(good)
            raise
        self._pending.clear()
        self._pending_bytes = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """Write what is queued (raising if that fails, with the file still open) and close the file."""
        if not self._file.closed:
            self.flush()
            self._file.close()

    def abandon(self) -> None:
        """Close the file without writing what is queued."""
        with contextlib.suppress(OSError, ValueError):
            self._file.close()

    def __enter__(self) -> EventFileAppender:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
