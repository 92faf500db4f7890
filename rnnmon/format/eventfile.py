"""TensorBoard event files at the record level: append records, and walk them back with every checksum checked.

An event file is a sequence of TFRecords: `length` (uint64 LE), the masked CRC-32C of those 8 bytes, `length`
bytes of a serialized `Event`, and the masked CRC-32C of the data. Reading and writing here needs no TensorFlow
(TensorBoard's own writer and reader import it when it is installed: 2.5 s), and the walk is what tells a
truncated or bit-flipped file from a good one, which TensorBoard's data provider does not say.

Anything can sit in a log directory under an event file's name. Only a regular file is read, opened non-blocking
(a FIFO or a link to /dev/zero is an error at once, never a hang), a chunk at a time and never past its size when
the walk began; a file that holds no record within the longest one allowed (a huge sparse file) is an error
after that prefix. `RecordCursor` follows a live file, also across a cut below what it read.

Example:
    >>> with EventFileAppender("runs/exp1/rnnmon") as out:
    ...     out.add(event.SerializeToString())
    ...     out.flush()
    >>> scan = scan_records(out.path)
    >>> len(scan.records), scan.problem
    (1, None)
"""

from __future__ import annotations

import array
import bisect
import collections
import contextlib
import dataclasses
import errno
import functools
import io
import os
import re
import socket
import stat
import struct
import threading
import time
from types import TracebackType

import numpy as np

try:  # the C implementation: ~2 GB/s
    from google_crc32c import value as _crc32c
except ImportError:  # pragma: no cover - the pure-Python fallback, ~10 MB/s
    _crc32c = None

MAX_RECORD_BYTES = 32 << 20  # no rnnmon record comes near this; a longer length is damage, not data
READ_CHUNK_BYTES = 1 << 20  # read at a time (more only for a longer record)
SCAN_BATCH_BYTES = 64 << 20  # records one `RecordCursor.scan` returns at most (by default), then `more`
TAIL_GRACE_S = 10.0  # a file that ends inside a record for longer than this is truncated, not being written
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
    """What a scan found: the good records, where reading stopped, and what was wrong, if anything."""

    records: list[bytes]
    offset: int  # the byte after the last whole record read (resume here)
    problem: str | None = None  # damage: a checksum mismatch or an impossible length
    truncated: bool = False  # the file ends inside a record (a crash mid-write, a partial copy, or a live writer)
    more: bool = False  # stopped after `max_bytes`, at a record: scan again for the rest
    modified: float = 0.0  # the file's modification time (Unix seconds), from the descriptor read


def truncated_at(offset: int) -> str:
    """The damage of a file that ends inside the record at `offset` for good (past a live writer's grace time)."""
    return f"truncated: the file ends inside the record at byte {offset}"


_CUT = (r"(?:truncated: the file ends inside the record at byte \d+"
        r"|(?:record at byte \d+ cut short|corrupt record at byte \d+ \(data checksum mismatch\)): "
        r"bytes \d+-\d+ skipped, read on from the next whole record)")
_CUT_ONLY = re.compile(rf".*?: {_CUT}(?:; {_CUT})*", re.DOTALL)


def is_cut(error: str) -> bool:
    """Whether a reader's error (`<file>: <damage>`) is only a cut through records: the file ends inside a record,
    or a record was cut and written after (the next whole record starts inside it), its whole records before and
    after read. Readers that serve what is readable (the tab) name such damage as a note, not an error."""
    return _CUT_ONLY.fullmatch(error) is not None


class NotRegularFileError(OSError):
    """A path named like an event file that is not a regular file (a FIFO, a device, a folder): never read."""


def open_regular(path: str, follow_links: bool = True) -> int:
    """A read-only descriptor of the regular file at `path` (a link is followed, as TensorBoard does, unless not
    `follow_links`: then a link is a NotRegularFileError).

    Opened non-blocking, so a FIFO does not wait for a writer, and checked on the descriptor itself, so nothing
    swapped in after a check is read; anything but a regular file raises NotRegularFileError saying what it is.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags if follow_links else flags | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        if error.errno == errno.ELOOP and not follow_links:
            raise NotRegularFileError(errno.ELOOP, "not a regular file (a symbolic link)", path) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(errno.EINVAL, f"not a regular file ({_kind(mode)})", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "an unknown kind of file"


def scan_records(path: str, offset: int = 0, max_record_bytes: int = MAX_RECORD_BYTES,
                 max_bytes: int | None = None) -> Scan:
    """Every whole, checksummed record of the file at `path` from `offset` on (up to `max_bytes` of them).

    A one-off `RecordCursor(offset).scan(...)`: see there for damage, cut files and what is read.
    """
    return RecordCursor(offset).scan(path, max_bytes, max_record_bytes)


class RecordCursor:
    """A reader's place in one event file; each `scan` returns the records written since the last one.

    Only a regular file is read (`open_regular`), in chunks of `READ_CHUNK_BYTES`, never past its size when the
    scan began. A record whose data checksum fails is skipped and named in `problem`. A damaged length, or a record
    that was cut and written after, is skipped up to the next whole record (both checksums right) within the
    longest record the format allows; with none there, the walk ends at the damage, and is taken up again only
    once the file's size changes. A file that ends inside a record sets `truncated`, and the offset stays before that
    record, so a reader can come back for it.

    The cursor remembers where each record it read ended and its checksum. A file cut below that place, or whose
    last record read is no longer there (cut, then written after), is walked again from its last record still in
    place; records that come back unchanged at the same place are not returned twice.
    """

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self._ends = array.array("q")  # per record read, in file order: the byte after it...
        self._checks = array.array("I")  # ...and its data checksum, as written in the file
        self._returned: dict[int, int] = {}  # after a cut: end -> checksum of records returned before it
        self._stuck: tuple[int, int, str] | None = None  # (offset, file size, problem) of a walk ended at damage

    def scan(self, path: str, max_bytes: int | None = SCAN_BATCH_BYTES,
             max_record_bytes: int = MAX_RECORD_BYTES) -> Scan:
        """The whole records after the last scan's, up to about `max_bytes` of them (None: all)."""
        fd = open_regular(path)
        try:
            info = os.fstat(fd)
            size = info.st_size
            if self.offset > size or (self._ends and not self._in_place(fd, len(self._ends) - 1, size)):
                self._rewind(fd, size)
            if self._stuck is not None and self._stuck[:2] == (self.offset, size):
                return Scan([], self.offset, self._stuck[2], modified=info.st_mtime)
            until = size if max_bytes is None else min(size, self.offset + max_bytes)
            return self._walk(_Window(fd, size, until), max_bytes, max_record_bytes, info.st_mtime)
        finally:
            os.close(fd)

    def _in_place(self, fd: int, index: int, size: int) -> bool:
        """The record read `index`-th still ends where it did, with the same checksum."""
        end = self._ends[index]
        return end <= size and os.pread(fd, _FOOTER.size, end - _FOOTER.size) == _FOOTER.pack(self._checks[index])

    def _rewind(self, fd: int, size: int) -> None:
        """Go back to the end of the last record read that is still in place; remember the ones after it."""
        index = bisect.bisect_right(self._ends, size) - 1
        while index >= 0 and not self._in_place(fd, index, size):
            index -= 1
        self._returned.update(zip(self._ends[index + 1:], self._checks[index + 1:]))
        del self._ends[index + 1:], self._checks[index + 1:]
        self.offset = self._ends[index] if index >= 0 else 0
        self._stuck = None

    def _walk(self, window: _Window, max_bytes: int | None, max_record_bytes: int, modified: float) -> Scan:
        records: list[bytes] = []
        problems: list[str] = []
        position, size = self.offset, window.size
        stop_at = size if max_bytes is None else min(size, position + max_bytes)
        truncated = more = stuck = False
        crc, header, footer = _crc32c or crc32c, _HEADER.unpack_from, _FOOTER.unpack_from  # the loop runs per record
        ends, checks, returned = self._ends, self._checks, self._returned
        while position < size:
            if position >= stop_at:
                more = True
                break
            held = window.start <= position and position + _HEADER.size <= window.start + len(window.data)
            if not held and not window.cover(position, _HEADER.size):
                truncated = True
                break
            start = position - window.start
            length, length_crc = header(window.data, start)
            check = crc(window.data[start:start + 8])
            if length > max_record_bytes or (((check >> 15) | (check << 17)) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
                found = _next_record(window, position + 1, max_record_bytes)  # a damaged length, or no event file
                if found is None:
                    problems.append(f"corrupt record header at byte {position} (no whole record after it)")
                    stuck = True
                    break
                problems.append(f"corrupt record header at byte {position}: bytes {position}-{found} skipped, "
                                f"read on from the next whole record")
                position = found
                continue
            stop = position + _HEADER.size + length + _FOOTER.size
            if stop > window.start + len(window.data) and not window.cover(position, stop - position):
                found = _next_record(window, position + 1, max_record_bytes, whole=True)
                if found is None:  # a record being written, or cut short for good (the reader tells)
                    truncated = True
                    break
                problems.append(f"record at byte {position} cut short: bytes {position}-{found} skipped, read on "
                                f"from the next whole record")
                position = found
                continue
            end = stop - window.start - _FOOTER.size
            payload = window.data[end - length:end]
            check = crc(payload)
            expected = footer(window.data, end)[0]
            if (((check >> 15) | (check << 17)) + _MASK_DELTA) & 0xFFFFFFFF == expected:  # masked_crc32c, inlined
                if not returned or returned.pop(stop, None) != expected:
                    records.append(payload)
                ends.append(stop)
                checks.append(expected)
                position = stop
                continue
            # a flipped bit in its data (the next record starts where it ends), or a record cut short and written
            # after (the next one starts inside it)
            found = _next_record(window, position + 1, max_record_bytes)
            if found == stop or (found is None and stop == size):
                problems.append(f"corrupt record at byte {position} (data checksum mismatch; skipped)")
                position = stop
                continue
            if found is None:
                problems.append(f"corrupt record at byte {position} (data checksum mismatch; no whole record after "
                                f"it)")
                stuck = True
                break
            problems.append(f"corrupt record at byte {position} (data checksum mismatch): bytes {position}-{found} "
                            f"skipped, read on from the next whole record")
            position = found
        self.offset = position
        problem = "; ".join(problems) or None
        self._stuck = (position, size, problem or "") if stuck else None
        return Scan(records, position, problem, truncated, more, modified)


class _Window:
    """Bytes [start, start + len(data)) of an open file, read ahead in chunks, never past `size`, nor past `until`
    (where a scan stops walking) but for the bytes asked for (the record that crosses it)."""

    def __init__(self, fd: int, size: int, until: int | None = None) -> None:
        self.fd, self.size = fd, size
        self.until = size if until is None else until
        self.start, self.data = 0, b""

    def cover(self, position: int, count: int) -> bool:
        """Hold bytes [position, position + count); False where the file ends first."""
        end = position + count
        if end > self.size:
            return False
        held = self.start + len(self.data)
        if self.start <= position and end <= held:
            return True
        keep = self.data[position - self.start:] if self.start <= position <= held else b""
        want = min(self.size, max(end, min(position + READ_CHUNK_BYTES, self.until))) - position - len(keep)
        self.data, self.start = keep + _pread(self.fd, want, position + len(keep)), position
        return end <= self.start + len(self.data)  # False: the file shrank meanwhile


def _pread(fd: int, count: int, offset: int) -> bytes:
    parts = []
    while count > 0:
        part = os.pread(fd, min(count, READ_CHUNK_BYTES), offset)
        if not part:
            break
        parts.append(part)
        count -= len(part)
        offset += len(part)
    return b"".join(parts)


def _record_length(window: _Window, position: int, max_record_bytes: int) -> int | None:
    """The length in the record header at `position`, or None where the header is damaged or not there whole."""
    if not window.cover(position, _HEADER.size):
        return None
    length, length_crc = _HEADER.unpack_from(window.data, position - window.start)
    start = position - window.start
    if length > max_record_bytes or masked_crc32c(window.data[start:start + 8]) != length_crc:
        return None
    return length


def _next_record(window: _Window, start: int, max_record_bytes: int, whole: bool = False) -> int | None:
    """Where the first record at or after `start` begins, within the longest record allowed: a header with its
    checksum right, and either its data with its checksum right, or (unless `whole`) the file ending inside it (a
    record being written). None when there is none, or when the records that headers there claim add up to more
    than twice the longest allowed (a file made of such headers costs a bounded number of checksums)."""
    end = min(window.size - _HEADER.size + 1, start + max_record_bytes + _HEADER.size + _FOOTER.size)
    budget = 2 * max_record_bytes
    for piece in range(start, end, READ_CHUNK_BYTES):
        count = min(READ_CHUNK_BYTES, end - piece)
        for found in _header_offsets(_pread(window.fd, count + _HEADER.size - 1, piece), count, max_record_bytes):
            position = piece + int(found)
            length = _record_length(window, position, max_record_bytes)
            if length is None:  # the file shrank meanwhile
                continue
            stop = position + _HEADER.size + length + _FOOTER.size
            if stop > window.size:
                if whole:
                    continue
                return position
            budget -= length
            if budget < 0:
                return None
            window.cover(position, stop - position)
            first = position - window.start + _HEADER.size
            if masked_crc32c(window.data[first:first + length]) == _FOOTER.unpack_from(window.data, first + length)[0]:
                return position
    return None


def _header_offsets(data: bytes, count: int, max_record_bytes: int) -> np.ndarray:
    """The offsets below `count` in `data` where a record header with its checksum right begins, in order.

    Vectorized: a header is a little-endian length (below 2**32 here, so its high word is 0) and the masked
    CRC-32C of its 8 bytes. CRC-32C is affine over fixed-length input, so that checksum is a XOR of four table
    entries, one per byte of the low word. 12 zero bytes (a sparse file) are never a header: the masked checksum
    of 8 zero bytes is not 0.
    """
    base, tables = _length_crc_tables()
    limit = min(max_record_bytes, 0xFFFFFFFF)
    found = []
    for shift in range(min(4, len(data) - _HEADER.size + 1)):  # every offset: words from 0, 1, 2 and 3 on
        words = np.frombuffer(data, dtype="<u4", count=(len(data) - shift) // 4, offset=shift)
        low, high, check = words[:-2], words[1:-1], words[2:]
        candidates = np.flatnonzero((high == 0) & (low <= limit) & ((low != 0) | (check != 0)))
        length = low[candidates]
        crc = (base ^ tables[0][length & 0xFF] ^ tables[1][(length >> 8) & 0xFF] ^ tables[2][(length >> 16) & 0xFF]
               ^ tables[3][length >> 24])
        masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
        found.append(shift + 4 * candidates[masked == check[candidates]])
    offsets = np.sort(np.concatenate(found)) if found else np.empty(0, dtype=np.intp)
    return offsets[offsets < count]


@functools.cache
def _length_crc_tables() -> tuple[np.uint32, np.ndarray]:
    """CRC-32C of 8 zero bytes, and per byte `k` < 4 and value `v`: what `v` at `k` changes in that CRC."""
    base = crc32c(bytes(8))
    tables = np.array([[crc32c(bytes(k) + bytes([v]) + bytes(7 - k)) ^ base for v in range(256)] for k in range(4)],
                      dtype=np.uint32)
    return np.uint32(base), tables


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
        self.end = os.fstat(self._file.fileno()).st_size  # where the next record added will start, once written

    def _open(self) -> io.FileIO:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        return io.FileIO(self.path, "a")  # unbuffered: a failed write leaves nothing behind to write later

    def add(self, record: bytes) -> int:
        """Queue `record`; returns the offset it will have in the file (unless records are dropped first)."""
        offset = self.end
        self.end += len(record) + _HEADER.size + _FOOTER.size
        self._pending.append(record)
        self._pending_bytes += len(record)
        while self._pending_bytes > self._max_pending_bytes and len(self._pending) > 1:
            self._pending_bytes -= len(self._pending.popleft())
            self.dropped += 1
        return offset

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
        self.end = os.fstat(self._file.fileno()).st_size
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

    def size(self) -> int:
        """Bytes written to the file so far (0 where it cannot be looked at)."""
        try:
            return os.fstat(self._file.fileno()).st_size
        except (OSError, ValueError):
            return 0

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
