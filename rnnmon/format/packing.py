"""rnnmon's compact tables (summary format versions 2 to 5): a chunk of rows packed into one bytes value.

Version 1 stored every table as float64 `[rows, columns]`: 56 bytes per step. Version 2 packs a chunk into a
little-endian blob, stored as a scalar `DT_STRING` tensor:

    header  (24 bytes): magic b"rnm2", layout id (uint8; +128 when the body is zlib-compressed), 3 pad bytes,
                        rows (uint32), exceptions (uint32), anchor (float64, Unix seconds)
    body    rows × the layout's row size, then (steps only) exceptions × 8 float64: (row, step, epoch, begin,
                        end, input_wait_ms, host_gap_ms, batches), the whole v1 row of each step the compact
                        row cannot carry; zlib-compressed (level 1) when that saves a tenth or more

Times are integer microseconds from the anchor, durations integer microseconds.

Format version 4 writes the same rows column by column (magic b"rnm3"): the rows' bytes as byte planes (for each
field in row order, its first byte of every row, then its second, ...), and a "t" column as each row's difference
from the previous row's time (the first row's from the anchor), so a slowly changing column leaves runs of equal
bytes that zlib shrinks; the exception rows follow unchanged. A steady step then costs about 4.6 bytes instead of
6.7 after compression, a gap 3.3 instead of 6.8. Readers take both magics. A steps row is 12 bytes
(duration, input wait, host gap: int32 µs, input wait −1 when not measured); the step number, epoch, batches,
begin and end follow from the previous row (begin = previous end + host gap). A row where that does not hold
(each chunk's first step, a new fit or epoch, a different batch count) is an exception. Other tables have no
exceptions: a chunk that does not fit its layout (a time over 35 minutes after the chunk's first, a non-integer
utilization) is written as a version-1 float64 table instead, and readers take both.

Format version 5 writes the same bodies behind a 17-byte header (magic b"rnm4" row by row, b"rnm5" as byte planes;
layout id; rows uint32; anchor float64; the steps layout adds its exceptions, uint32) and deflates them as a raw
stream (no zlib header or checksum: the event's CRC covers them) from 16 bytes on, so a 2-s utilization chunk of a
dozen 5-byte rows shrinks too: about 13 bytes less per chunk of each GPU table, what a short fit's GPU data is made
of (docs/performance.md). Readers take all four magics.

Which columns a layout holds, and how each is stored (its storage code), is declared in `rnnmon.format.series`
(`layout_of`) and, from format version 3, written in each tag's metadata, so a reader decodes a layout it did not
compile in (`stored_layout`): the layout id in the header names the table's codec, the metadata its columns.

Decoding checks the body's length against the header before it allocates anything (a compressed body is
inflated no further than the header's rows allow, at most `MAX_ROWS` of them), so a damaged or hostile record
cannot claim more memory than a legitimate chunk.

Example:
    >>> blob = encode(STEPS_TAG, rows)            # None when the chunk must stay float64
    >>> decode(STEPS_TAG, blob)                   # float64 [rows, 7], as version 1 stored it
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
import zlib
from typing import Any

import numpy as np

from rnnmon.format import schema, series

MAGIC = b"rnm2"  # rows stored row by row (format versions 2 and 3)
PLANES_MAGIC = b"rnm3"  # rows stored as byte planes, "t" as differences (format version 4)
COMPACT_MAGIC = b"rnm4"  # row by row, short header, raw deflate (format version 5)
COMPACT_PLANES_MAGIC = b"rnm5"  # byte planes, short header, raw deflate (format version 5)
MAGICS = (MAGIC, PLANES_MAGIC, COMPACT_MAGIC, COMPACT_PLANES_MAGIC)
_PLANES = (PLANES_MAGIC, COMPACT_PLANES_MAGIC)
_COMPACT = (COMPACT_MAGIC, COMPACT_PLANES_MAGIC)
PLANES_VERSION = 4  # the format version from which writers write byte planes
COMPACT_VERSION = 5  # the format version from which writers write the short header and raw deflate
MAX_ROWS = 1 << 16  # rows in one chunk; the writer splits larger chunks
_HEAD = struct.Struct("<4sB3xIId")
_COMPACT_HEAD = struct.Struct("<4sBId")  # magic, layout id (+128: deflated), rows, anchor; steps: + exceptions
_EXCEPTIONS = struct.Struct("<I")
_I32 = 2**31 - 1
_ZLIB = 0x80  # layout flag: the body is zlib-compressed
_MIN_ZLIB_BYTES = 64  # version 4 deflated bodies from this size
_MIN_COMPRESS_BYTES = 16  # version 5 from this size: a util chunk's dozen rows shrink by a quarter
_US = 1e6


class FormatError(ValueError):
    """A chunk that does not decode: wrong size, wrong layout, impossible values."""


CODES = {"t": "<i4", "d": "<i4", "u1": "u1", "i1": "i1", "f4": "<f4", "f2": "<f2"}  # storage code -> stored type
_INT_RANGE = {"u1": (0, 255), "i1": (-128, 127)}
_STEPS_LAYOUT = 1
_STEP_ROW = np.dtype([("duration_us", "<i4"), ("input_wait_us", "<i4"), ("host_gap_us", "<i4")])
MAX_COLUMNS = 64


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one tag's packed chunks are laid out: the header's layout id, the columns rebuilt, in order, and per
    column its storage code (`CODES`: "t" int32 µs from the anchor, "d" int32 µs after the "t" column, "u1"/"i1"
    small integers, "f4"/"f2" floats). Layout 1 is the steps codec: its columns are `schema.STEP_COLUMNS` and it
    has no codes. Built from declarations (`layout_of`) or from a tag's stored metadata (`stored_layout`), and
    checked either way: FormatError when it does not describe a decodable layout.
    """

    id: int
    columns: tuple[str, ...]
    codes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.id == _STEPS_LAYOUT:
            if self.columns != schema.STEP_COLUMNS or self.codes:
                raise FormatError("layout 1 is the steps codec: its columns are fixed and it has no codes")
            return
        if not 1 < self.id < _ZLIB or len(self.codes) != len(self.columns) or not 0 < len(self.codes) <= MAX_COLUMNS:
            raise FormatError(f"layout {self.id} with {len(self.columns)} columns and {len(self.codes)} storage "
                              f"codes: ids are 2-127, one code per column, at most {MAX_COLUMNS} columns")
        unknown = sorted({str(code) for code in self.codes} - set(CODES))
        if unknown:
            raise FormatError(f"layout {self.id} stores a column as {', '.join(unknown)}, a storage code this "
                              f"reader does not know ({', '.join(CODES)})")
        if self.codes.count("t") != 1 or len(set(self.columns)) != len(self.columns):
            raise FormatError(f"layout {self.id} needs exactly one time column ('t') and distinct column names")

    @functools.cached_property
    def dtype(self) -> np.dtype:
        """A packed row (steps: the compact row, without exceptions)."""
        if self.id == _STEPS_LAYOUT:
            return _STEP_ROW
        return np.dtype([(f"c{i}", CODES[code]) for i, code in enumerate(self.codes)])

    @functools.cached_property
    def time(self) -> int:
        """The index of the "t" column."""
        return self.codes.index("t")


STEPS_LAYOUT = Layout(_STEPS_LAYOUT, schema.STEP_COLUMNS)
_EXCEPTION_BYTES = 8 * (len(schema.STEP_COLUMNS) + 1)


@functools.lru_cache(maxsize=1024)
def layout_of(tag: str, fmt: series.Format = series.FORMAT) -> Layout | None:
    """The layout `fmt` declares for `tag`'s chunks; None when they are never packed (phases, documents)."""
    table = fmt.table(tag)
    if table is None or table.codec == series.FLOAT64_CODEC:
        return None
    if table.codec == series.STEPS_CODEC:
        return STEPS_LAYOUT
    return Layout(table.layout, table.columns, table.storage)


def stored_layout(tag: str, content: dict[str, Any]) -> Layout | None:
    """The layout of `tag`'s packed chunks as its stored metadata `content` describes it; None for a tag whose
    chunks this reader does not unpack. FormatError when the content describes a layout that cannot be decoded.

    Version 3 stores `columns`, `storage` (a code per column) and `layout`; versions 1 and 2 store only the
    columns, whose codes are then this reader's declared codes of the same names (as version 2 wrote them).
    """
    declared = layout_of(tag)
    if declared is None or declared.id == _STEPS_LAYOUT:
        return declared
    columns = content.get("columns", declared.columns)
    codes = content.get("storage")
    if not isinstance(columns, list | tuple) or not all(isinstance(name, str) for name in columns):
        raise FormatError("metadata whose columns are not a list of names")
    if codes is None:
        known = dict(zip(declared.columns, declared.codes))
        missing = [name for name in columns if name not in known]
        if missing:
            raise FormatError(f"columns {', '.join(missing)[:200]} without storage codes in the metadata (format "
                              "version 2 or earlier) and unknown to this reader: packed chunks cannot be decoded")
        codes = [known[name] for name in columns]
    if not isinstance(codes, list) or not all(isinstance(code, str) for code in codes):
        raise FormatError("metadata whose storage is not a list of codes")
    layout_id = content.get("layout", declared.id)
    if isinstance(layout_id, bool) or not isinstance(layout_id, int):
        raise FormatError(f"metadata layout {str(layout_id)[:20]!r} is not an integer")
    return Layout(layout_id, tuple(columns), tuple(codes))


def _layout(tag: str) -> Layout | None:
    return layout_of(tag)


def packable(tag: str) -> bool:
    """Whether `tag` has a compact layout (phases and documents stay as they were)."""
    return _layout(tag) is not None


def is_packed(value: bytes) -> bool:
    """Whether a string value starts as a packed chunk does (either magic)."""
    return value[:4] in MAGICS


def encode(tag: str, rows: np.ndarray, layout: Layout | None = None, *, planes: bool = True,
           compact: bool = True) -> bytes | None:
    """The chunk `rows` (float64, the layout's columns) packed for `tag` in `layout` (default: the declared one),
    or None when it must stay a float64 table. `planes`: byte planes where smaller (format version 4), else row by
    row (b"rnm2", as versions 2 and 3 wrote); `compact` (with `planes`): the short header and raw deflate of
    version 5 (b"rnm4", b"rnm5"), else version 4's (b"rnm2", b"rnm3")."""
    rows = np.asarray(rows, dtype=np.float64)
    layout = layout or _layout(tag)
    if layout is None or rows.ndim != 2 or not 0 < len(rows) <= MAX_ROWS or rows.shape[1] != len(layout.columns):
        return None
    if layout.id == _STEPS_LAYOUT:
        return _encode_steps(rows, planes, compact)
    time_column = rows[:, layout.time]
    if not np.isfinite(time_column).all():
        return None
    anchor = float(time_column.min())
    out = np.zeros(len(rows), dtype=layout.dtype)
    time_us = np.rint((time_column - anchor) * _US)
    for i, code in enumerate(layout.codes):
        column = rows[:, i]
        if code == "t":
            stored = time_us
        elif code == "d":
            stored = np.rint((column - anchor) * _US) - time_us
        elif code in _INT_RANGE:
            lo, hi = _INT_RANGE[code]
            if not (np.isfinite(column).all() and (column == np.rint(column)).all()
                    and column.min() >= lo and column.max() <= hi):
                return None
            stored = column
        else:
            stored = column.astype(CODES[code])
            if (np.isfinite(column) & ~np.isfinite(stored)).any():  # too large for the float type
                return None
        if code in ("t", "d") and not (np.isfinite(stored).all() and stored.min() >= 0 and stored.max() <= _I32):
            return None
        out[f"c{i}"] = stored
    return _pack(layout.id, len(rows), 0, anchor, out, b"", planes, compact, layout.time)


def decode(tag: str, blob: bytes, layout: Layout | None = None) -> np.ndarray:
    """float64 `[rows, columns]` (the layout's columns) from a packed chunk of `tag`; FormatError when it is not
    one. `layout`: as the tag's metadata describes it (`stored_layout`), default the declared one."""
    table, _, errors = decode_many(tag, [blob], layout)
    if errors:
        raise errors[0][1]
    return table


Decoded = tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, FormatError]]]


def decode_many(tag: str, blobs: list[bytes], layout: Layout | None = None) -> Decoded:
    """Chunks of one tag, all in `layout` (default: the declared one), decoded with the arithmetic done once.

    Returns the rows of the chunks that decode, concatenated in order, in `layout.columns`; (index in `blobs`,
    row count) of each of them; and (index, error) of each that does not.
    """
    layout = layout or _layout(tag)
    errors: list[tuple[int, FormatError]] = []
    parts = []
    for index, blob in enumerate(blobs):
        try:
            parts.append((index, *_unpack(tag, blob, layout)))
        except FormatError as error:
            errors.append((index, error))
    if layout is None:
        return np.empty((0, len(schema.columns_for(tag) or ()))), [], errors
    try:
        table = _rebuild(layout, parts)
    except FormatError:  # one of them is bad: rebuild them one by one to say which
        tables = []
        for part in list(parts):
            try:
                tables.append(_rebuild(layout, [part]))
            except FormatError as error:
                errors.append((part[0], error))
                parts.remove(part)
        errors.sort(key=lambda pair: pair[0])
        table = np.concatenate(tables) if tables else _rebuild(layout, [])
    return table, [(index, rows) for index, _, rows, _, _ in parts], errors


def _unpack(tag: str, blob: bytes, layout: Layout | None) -> tuple[bytes, int, int, float]:
    """(body, rows, exceptions, anchor) of one chunk of `tag` in `layout`, header and body checked.

    The body is inflated no further than the header's rows allow, and must be exactly that long.
    """
    magic, layout_id, rows, exceptions, anchor, start = _read_header(blob)
    if rows > MAX_ROWS or exceptions > rows or not math.isfinite(anchor):
        raise FormatError(f"packed chunk header claims {rows} rows, {exceptions} exceptions, anchor {anchor}")
    compressed, layout_id = layout_id & _ZLIB, layout_id & ~_ZLIB
    if layout is None or layout_id != layout.id:
        raise FormatError(f"layout {layout_id} where steps (1) belong" if tag == schema.STEPS_TAG
                          else f"layout {layout_id} does not belong to {tag}")
    per_exception = _EXCEPTION_BYTES if layout.id == _STEPS_LAYOUT else 0
    if exceptions and not per_exception:
        raise FormatError(f"{exceptions} exceptions in a layout that has none")
    expected = rows * layout.dtype.itemsize + exceptions * per_exception
    if compressed:
        inflater = zlib.decompressobj(-15 if magic in _COMPACT else 15)
        try:
            body = inflater.decompress(memoryview(blob)[start:], expected + 1)
        except zlib.error as error:
            raise FormatError(f"packed chunk body does not inflate: {error}") from None
        if not inflater.eof or inflater.unused_data:
            raise FormatError(f"packed chunk body inflates past its {expected} bytes, or stops short")
    else:
        body = bytes(blob[start:])
    if len(body) != expected:
        raise FormatError(f"packed chunk body of {len(body)} bytes where the header implies {expected}")
    if magic in _PLANES:
        body = _from_planes(body, rows, layout)
    return body, rows, exceptions, anchor


def _read_header(blob: bytes) -> tuple[bytes, int, int, int, float, int]:
    """(magic, layout byte, rows, exceptions, anchor, where the body starts) of a chunk of any version."""
    magic = bytes(blob[:4])
    if magic not in MAGICS:
        raise FormatError("packed chunk without an rnm2, rnm3, rnm4 or rnm5 magic")
    if magic not in _COMPACT:
        if len(blob) < _HEAD.size:
            raise FormatError(f"packed chunk of {len(blob)} bytes is shorter than its header")
        return (*_HEAD.unpack_from(blob), _HEAD.size)
    if len(blob) < _COMPACT_HEAD.size:
        raise FormatError(f"packed chunk of {len(blob)} bytes is shorter than its header")
    _, layout_id, rows, anchor = _COMPACT_HEAD.unpack_from(blob)
    if layout_id & ~_ZLIB != _STEPS_LAYOUT:
        return magic, layout_id, rows, 0, anchor, _COMPACT_HEAD.size
    if len(blob) < _COMPACT_HEAD.size + _EXCEPTIONS.size:
        raise FormatError(f"packed steps chunk of {len(blob)} bytes is shorter than its header")
    (exceptions,) = _EXCEPTIONS.unpack_from(blob, _COMPACT_HEAD.size)
    return magic, layout_id, rows, exceptions, anchor, _COMPACT_HEAD.size + _EXCEPTIONS.size


def _to_planes(packed: np.ndarray) -> bytes:
    """Rows as byte planes: for each field, its first byte of every row, then its second, ..."""
    raw = packed.view(np.uint8).reshape(len(packed), packed.dtype.itemsize)
    fields = packed.dtype.fields
    return b"".join(raw[:, fields[name][1]:fields[name][1] + fields[name][0].itemsize].T.tobytes()
                    for name in packed.dtype.names)


@functools.lru_cache(maxsize=64)
def _plane_order(layout: Layout, rows: int) -> np.ndarray:
    """For each byte of `rows` packed rows in `layout`, where the byte-planes body holds it."""
    dtype = layout.dtype
    order = np.empty((rows, dtype.itemsize), dtype=np.int32)
    read = 0
    for name in dtype.names:
        size, at = dtype[name].itemsize, dtype.fields[name][1]
        order[:, at:at + size] = (read + np.arange(size * rows, dtype=np.int32).reshape(size, rows)).T
        read += rows * size
    return order.reshape(-1)


def _from_planes(body: bytes, rows: int, layout: Layout) -> bytes:
    """The row-by-row body of a byte-planes chunk (times summed back from their differences)."""
    dtype = layout.dtype
    read = rows * dtype.itemsize
    planes = np.frombuffer(body, np.uint8, read)
    if rows <= 1024:  # the usual chunk: one gather through a cached order
        out = planes[_plane_order(layout, rows)].view(dtype)
    else:
        out = np.empty(rows, dtype=dtype)
        raw = out.view(np.uint8).reshape(rows, dtype.itemsize)
        at_plane = 0
        for name in dtype.names:
            size, at = dtype[name].itemsize, dtype.fields[name][1]
            raw[:, at:at + size] = planes[at_plane:at_plane + rows * size].reshape(size, rows).T
            at_plane += rows * size
    if layout.id != _STEPS_LAYOUT:
        field = f"c{layout.time}"
        time_us = np.cumsum(out[field], dtype=np.int64)
        if len(time_us) and (time_us.min() < 0 or time_us.max() > _I32):
            raise FormatError("packed chunk whose time differences add up beyond int32 microseconds")
        out[field] = time_us
    return out.tobytes() + body[read:]


def _rebuild(layout: Layout, parts: list[tuple[int, bytes, int, int, float]]) -> np.ndarray:
    """The float64 table of unpacked chunks, concatenated."""
    if not parts:
        return np.empty((0, len(layout.columns)))
    counts = np.array([rows for _, _, rows, _, _ in parts], dtype=np.int64)
    if layout.id == _STEPS_LAYOUT:
        return _rebuild_steps(parts, counts)
    packed = np.frombuffer(b"".join(body for _, body, _, _, _ in parts), dtype=layout.dtype)
    anchor = np.repeat([anchor for *_, anchor in parts], counts)
    table = np.empty((len(layout.codes), len(packed))).T  # column-major, as the steps
    time_us = packed[f"c{layout.time}"].astype(np.float64)
    for i, code in enumerate(layout.codes):
        if code == "t":
            table[:, i] = anchor + time_us / _US
        elif code == "d":
            table[:, i] = anchor + (time_us + packed[f"c{i}"]) / _US
        else:
            table[:, i] = packed[f"c{i}"]
    return table


def _encode_steps(rows: np.ndarray, planes: bool, compact: bool) -> bytes | None:
    step, epoch, begin, end, wait_ms, gap_ms, batches = rows.T
    if not (np.isfinite(begin).all() and np.isfinite(end).all()):
        return None
    anchor = float(begin[0])
    begin_us, end_us = np.rint((begin - anchor) * _US), np.rint((end - anchor) * _US)
    duration = end_us - begin_us
    gap = np.r_[0.0, begin_us[1:] - end_us[:-1]]
    wait = np.where(np.isnan(wait_ms), -1.0, np.rint(wait_ms * 1e3))
    regular = np.r_[False, (epoch[1:] == epoch[:-1]) & (batches[1:] == batches[:-1])
                    & (step[1:] == step[:-1] + batches[1:])]
    regular &= np.abs(gap_ms * 1e3 - gap) <= 1.0  # NaN (a fit's first step) is never regular
    regular &= (duration >= 0) & (duration <= _I32) & (gap >= 0) & (gap <= _I32) & (wait >= -1) & (wait < _I32)
    regular &= (wait_ms == wait_ms) | (wait == -1)
    packed = np.zeros(len(rows), dtype=_STEP_ROW)
    packed["duration_us"] = np.where(regular, duration, 0)
    packed["input_wait_us"] = np.where(regular, wait, 0)
    packed["host_gap_us"] = np.where(regular, gap, 0)
    irregular = np.flatnonzero(~regular)
    exceptions = np.column_stack([irregular, rows[irregular]]).astype("<f8")
    return _pack(_STEPS_LAYOUT, len(rows), len(irregular), anchor, packed, exceptions.tobytes(), planes, compact)


def _pack(layout_id: int, rows: int, exceptions: int, anchor: float, packed: np.ndarray, extra: bytes,
          planes: bool, compact: bool, time: int | None = None) -> bytes:
    """Header and body of a chunk, the smaller of: the packed rows row by row (b"rnm2", b"rnm4"), and with `planes`,
    as byte planes with the time column `c<time>` as differences (b"rnm3", b"rnm5"); then `extra` (the exception
    rows)."""
    compact = compact and planes
    magics = (COMPACT_MAGIC, COMPACT_PLANES_MAGIC) if compact else (MAGIC, PLANES_MAGIC)
    chunks = [_packed(magics[0], layout_id, rows, exceptions, anchor, packed.tobytes() + extra)]
    if planes:  # whichever is smaller: planes pay off from a few dozen rows, not on a poll's few
        if time is not None:
            packed = packed.copy()
            packed[f"c{time}"] = np.diff(packed[f"c{time}"], prepend=0)
        chunks.append(_packed(magics[1], layout_id, rows, exceptions, anchor, _to_planes(packed) + extra))
    return min(chunks, key=len)


def _packed(magic: bytes, layout_id: int, rows: int, exceptions: int, anchor: float, body: bytes) -> bytes:
    """The header and `body`, deflated where that saves a tenth or more: a poll's few rows too (version 5 tries
    from 16 bytes, version 4 from 64), in a raw stream (version 5: no zlib header and checksum, 6 bytes a chunk;
    the event's CRC covers it)."""
    compact = magic in _COMPACT
    if len(body) >= (_MIN_COMPRESS_BYTES if compact else _MIN_ZLIB_BYTES):
        deflater = zlib.compressobj(1, zlib.DEFLATED, -15 if compact else 15)
        compressed = deflater.compress(body) + deflater.flush()
        if len(compressed) <= 0.9 * len(body):
            return _header(magic, layout_id | _ZLIB, rows, exceptions, anchor) + compressed
    return _header(magic, layout_id, rows, exceptions, anchor) + body


def _header(magic: bytes, layout_id: int, rows: int, exceptions: int, anchor: float) -> bytes:
    """Version 4's 24 bytes, or version 5's 17 (21 for steps: their exceptions' count; others have none)."""
    if magic not in _COMPACT:
        return _HEAD.pack(magic, layout_id, rows, exceptions, anchor)
    head = _COMPACT_HEAD.pack(magic, layout_id, rows, anchor)
    return head + _EXCEPTIONS.pack(exceptions) if layout_id & ~_ZLIB == _STEPS_LAYOUT else head


def _rebuild_steps(parts: list[tuple[int, bytes, int, int, float]], counts: np.ndarray) -> np.ndarray:
    width = len(schema.STEP_COLUMNS)
    compact = np.frombuffer(b"".join(body[: rows * _STEP_ROW.itemsize] for _, body, rows, _, _ in parts),
                            dtype=_STEP_ROW)
    extra = np.frombuffer(b"".join(body[rows * _STEP_ROW.itemsize:] for _, body, rows, _, _ in parts),
                          dtype="<f8").reshape(-1, width + 1)
    per_chunk = np.array([exceptions for _, _, _, exceptions, _ in parts], dtype=np.int64)
    chunk = np.repeat(np.arange(len(parts)), per_chunk)
    at = extra[:, 0]
    first = np.r_[0, np.cumsum(per_chunk)[:-1]]  # each chunk's first exception
    ordered = np.r_[True, (np.diff(at) > 0) | (np.diff(chunk) > 0)]
    if ((per_chunk == 0) & (counts > 0)).any() or (at[first[per_chunk > 0]] != 0).any() or not ordered.all() \
            or (at >= counts[chunk]).any() or (at != np.rint(at)).any():
        raise FormatError("packed steps chunk whose exception rows are not increasing row numbers from 0")
    whole = extra[:, 1:]
    if not np.isfinite(whole[:, [0, 1, 2, 3, 6]]).all():
        raise FormatError("packed steps chunk with a non-finite step, epoch, time or batch count")
    rows = len(compact)
    # Row numbers of the exceptions in the concatenation: strictly increasing from 0 (checked above), so each
    # exception starts a run of rows that follow from it, `length[i]` rows long.
    at = at.astype(np.int64) + np.r_[0, np.cumsum(counts)[:-1]][chunk]
    length = np.diff(np.r_[at, rows])
    out = np.empty((width, rows)).T  # column by column: every column below is written and read contiguously

    def spread(values: np.ndarray) -> np.ndarray:  # each exception's value on every row that follows it
        return np.repeat(values, length)

    duration = compact["duration_us"].astype(np.int64)
    gap = compact["host_gap_us"].astype(np.int64)
    since = np.add(gap, duration)
    np.cumsum(since, out=since)
    since -= spread(since[at])  # µs from the run's exception's end to this row's end
    offset = np.arange(rows) - spread(at)  # rows since the run's exception
    np.multiply(offset, spread(whole[:, 6]), out=out[:, 0])
    out[:, 0] += spread(whole[:, 0])
    out[:, 1] = spread(whole[:, 1])
    np.divide(since, _US, out=out[:, 3])
    out[:, 3] += spread(whole[:, 3])
    np.subtract(out[:, 3], duration / _US, out=out[:, 2])
    wait = compact["input_wait_us"]
    out[:, 4] = np.where(wait < 0, np.nan, wait / 1e3)
    np.divide(gap, 1e3, out=out[:, 5])
    out[:, 6] = spread(whole[:, 6])
    out[at] = whole
    return out
