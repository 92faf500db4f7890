"""rnnmon's compact tables (summary format version 2): a chunk of rows packed into one bytes value.

Version 1 stored every table as float64 `[rows, columns]`: 56 bytes per step. Version 2 packs a chunk into a
little-endian blob, stored as a scalar `DT_STRING` tensor:

    header  (24 bytes): magic b"rnm2", layout id (uint8; +128 when the body is zlib-compressed), 3 pad bytes,
                        rows (uint32), exceptions (uint32), anchor (float64, Unix seconds)
    body    rows × the layout's row size, then (steps only) exceptions × 8 float64: (row, step, epoch, begin,
                        end, input_wait_ms, host_gap_ms, batches), the whole v1 row of each step the compact
                        row cannot carry; zlib-compressed (level 1) when that saves a tenth or more

Times are integer microseconds from the anchor, durations integer microseconds. A steps row is 12 bytes
(duration, input wait, host gap: int32 µs, input wait −1 when not measured); the step number, epoch, batches,
begin and end follow from the previous row (begin = previous end + host gap). A row where that does not hold
(each chunk's first step, a new fit or epoch, a different batch count) is an exception. Other tables have no
exceptions: a chunk that does not fit its layout (a time over 35 minutes after the chunk's first, a non-integer
utilization) is written as a version-1 float64 table instead, and readers take both.

Decoding checks the body's length against the header before it allocates anything (a compressed body is
inflated no further than the header's rows allow, at most `MAX_ROWS` of them), so a damaged or hostile record
cannot claim more memory than a legitimate chunk.

Example:
    >>> blob = encode(STEPS_TAG, rows)            # None when the chunk must stay float64
    >>> decode(STEPS_TAG, blob)                   # float64 [rows, 7], as version 1 stored it
"""

from __future__ import annotations

import functools
import math
import struct
import zlib

import numpy as np

from rnnmon.format import schema

MAGIC = b"rnm2"
MAX_ROWS = 1 << 16  # rows in one chunk; the writer splits larger chunks
_HEAD = struct.Struct("<4sB3xIId")
_I32 = 2**31 - 1
_ZLIB = 0x80  # layout flag: the body is zlib-compressed
_MIN_COMPRESS_BYTES = 64
_EXCEPTION_BYTES = 8 * (len(schema.STEP_COLUMNS) + 1)
_US = 1e6


class FormatError(ValueError):
    """A chunk that does not decode: wrong size, wrong layout, impossible values."""


# Per layout: its id and, per output column, how it is stored: "t" int32 µs from the anchor, "d" int32 µs after
# the layout's "t" column, "u1"/"i1" small integers, "f4"/"f2" floats.
_LAYOUTS: dict[str, tuple[int, dict[str, str]]] = {
    schema.GAPS_TAG: (2, {"device": "i1", "start": "t", "end": "d", "cause": "u1"}),
    schema.UTIL_TAG_PREFIX: (3, {"time": "t", "util_pct": "u1"}),
    schema.STATS_TAG_PREFIX: (4, {"time": "t", "memory_used_mib": "f4", "memory_total_mib": "f4", "power_w": "f4",
                                  "sm_clock_mhz": "f4", "temperature_c": "f2", "pcie_rx_mib_s": "f4",
                                  "pcie_tx_mib_s": "f4", "clocks_event_reasons": "f4", "sm_activity_pct": "f2",
                                  "sm_occupancy_pct": "f2", "tensor_util_pct": "f2", "dram_bw_util_pct": "f2"}),
    schema.HOST_TAG: (5, {"time": "t", "cpu_pct": "f4"}),
}
_STEPS_LAYOUT = 1
_STEP_ROW = np.dtype([("duration_us", "<i4"), ("input_wait_us", "<i4"), ("host_gap_us", "<i4")])
_STORAGE = {"t": "<i4", "d": "<i4", "u1": "u1", "i1": "i1", "f4": "<f4", "f2": "<f2"}
_INT_RANGE = {"u1": (0, 255), "i1": (-128, 127)}
_ROW_DTYPES = {tuple(fields): np.dtype([(name, _STORAGE[code]) for name, code in fields.items()])
               for _, fields in _LAYOUTS.values()}
_ITEMSIZE = {layout_id: _ROW_DTYPES[tuple(fields)].itemsize for layout_id, fields in _LAYOUTS.values()}


@functools.lru_cache(maxsize=1024)
def _layout(tag: str) -> tuple[int, dict[str, str]] | None:
    for key, layout in _LAYOUTS.items():
        if tag == key or (key.endswith("gpu") and tag.startswith(key)):
            return layout
    return None


def _row_dtype(fields: dict[str, str]) -> np.dtype:
    return _ROW_DTYPES[tuple(fields)]


def packable(tag: str) -> bool:
    """Whether version 2 has a compact layout for `tag` (phases and documents stay as they were)."""
    return tag == schema.STEPS_TAG or _layout(tag) is not None


def encode(tag: str, rows: np.ndarray) -> bytes | None:
    """The chunk `rows` (float64, v1 columns) packed for `tag`, or None when it must stay a float64 table."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or not 0 < len(rows) <= MAX_ROWS:
        return None
    if tag == schema.STEPS_TAG:
        return _encode_steps(rows)
    layout = _layout(tag)
    if layout is None or rows.shape[1] != len(layout[1]):
        return None
    layout_id, fields = layout
    names = list(fields)
    time_column = rows[:, names.index(next(n for n, c in fields.items() if c == "t"))]
    if not np.isfinite(time_column).all():
        return None
    anchor = float(time_column.min())
    out = np.zeros(len(rows), dtype=_row_dtype(fields))
    time_us = np.rint((time_column - anchor) * _US)
    for i, (name, code) in enumerate(fields.items()):
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
            stored = column.astype(_STORAGE[code])
            if (np.isfinite(column) & ~np.isfinite(stored)).any():  # too large for the float type
                return None
        if code in ("t", "d") and not (np.isfinite(stored).all() and stored.min() >= 0 and stored.max() <= _I32):
            return None
        out[name] = stored
    return _pack(layout_id, len(rows), 0, anchor, out.tobytes())


def decode(tag: str, blob: bytes) -> np.ndarray:
    """float64 `[rows, columns]` (v1 columns) from a packed chunk of `tag`; FormatError when it is not one."""
    table, _, errors = decode_many(tag, [blob])
    if errors:
        raise errors[0][1]
    return table


Decoded = tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, FormatError]]]


def decode_many(tag: str, blobs: list[bytes]) -> Decoded:
    """Chunks of one tag decoded with the arithmetic done once for all of them.

    Returns the rows of the chunks that decode, concatenated in order; (index in `blobs`, row count) of each of
    them; and (index, error) of each that does not.
    """
    errors: list[tuple[int, FormatError]] = []
    parts = []
    sizes = _sizes(tag)
    for index, blob in enumerate(blobs):
        try:
            parts.append((index, *_unpack(tag, blob, sizes)))
        except FormatError as error:
            errors.append((index, error))
    try:
        table = _rebuild(tag, parts)
    except FormatError:  # one of them is bad: rebuild them one by one to say which
        tables = []
        for part in list(parts):
            try:
                tables.append(_rebuild(tag, [part]))
            except FormatError as error:
                errors.append((part[0], error))
                parts.remove(part)
        errors.sort(key=lambda pair: pair[0])
        table = np.concatenate(tables) if tables else _rebuild(tag, [])
    return table, [(index, rows) for index, _, rows, _, _ in parts], errors


@functools.lru_cache(maxsize=1024)
def _sizes(tag: str) -> tuple[int, int, int] | None:
    """(layout id, bytes per row, bytes per exception) of `tag`'s chunks; None when `tag` has no layout."""
    if tag == schema.STEPS_TAG:
        return _STEPS_LAYOUT, _STEP_ROW.itemsize, _EXCEPTION_BYTES
    layout = _layout(tag)
    return None if layout is None else (layout[0], _ITEMSIZE[layout[0]], 0)


def _unpack(tag: str, blob: bytes, sizes: tuple[int, int, int] | None) -> tuple[bytes, int, int, float]:
    """(body, rows, exceptions, anchor) of one chunk of `tag` (`sizes`: its `_sizes`), header and body checked.

    The body is inflated no further than the header's rows allow, and must be exactly that long.
    """
    if len(blob) < _HEAD.size:
        raise FormatError(f"packed chunk of {len(blob)} bytes is shorter than its header")
    magic, layout_id, rows, exceptions, anchor = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise FormatError("packed chunk without the rnm2 magic")
    if rows > MAX_ROWS or exceptions > rows or not math.isfinite(anchor):
        raise FormatError(f"packed chunk header claims {rows} rows, {exceptions} exceptions, anchor {anchor}")
    compressed, layout_id = layout_id & _ZLIB, layout_id & ~_ZLIB
    if sizes is None or layout_id != sizes[0]:
        raise FormatError(f"layout {layout_id} where steps (1) belong" if tag == schema.STEPS_TAG
                          else f"layout {layout_id} does not belong to {tag}")
    if exceptions and not sizes[2]:
        raise FormatError(f"{exceptions} exceptions in a layout that has none")
    expected = rows * sizes[1] + exceptions * sizes[2]
    if compressed:
        inflater = zlib.decompressobj()
        try:
            body = inflater.decompress(memoryview(blob)[_HEAD.size:], expected + 1)
        except zlib.error as error:
            raise FormatError(f"packed chunk body does not inflate: {error}") from None
        if not inflater.eof or inflater.unused_data:
            raise FormatError(f"packed chunk body inflates past its {expected} bytes, or stops short")
    else:
        body = bytes(blob[_HEAD.size:])
    if len(body) != expected:
        raise FormatError(f"packed chunk body of {len(body)} bytes where the header implies {expected}")
    return body, rows, exceptions, anchor


def _rebuild(tag: str, parts: list[tuple[int, bytes, int, int, float]]) -> np.ndarray:
    """The float64 table of unpacked chunks, concatenated."""
    if not parts:
        return np.empty((0, len(schema.columns_for(tag) or ())))
    counts = np.array([rows for _, _, rows, _, _ in parts], dtype=np.int64)
    if tag == schema.STEPS_TAG:
        return _rebuild_steps(parts, counts)
    fields = _layout(tag)[1]  # type: ignore[index]  # _unpack checked the layout
    packed = np.frombuffer(b"".join(body for _, body, _, _, _ in parts), dtype=_row_dtype(fields))
    anchor = np.repeat([anchor for *_, anchor in parts], counts)
    table = np.empty((len(fields), len(packed))).T  # column-major, as the steps
    time_us = packed[next(name for name, code in fields.items() if code == "t")].astype(np.float64)
    for i, (name, code) in enumerate(fields.items()):
        if code == "t":
            table[:, i] = anchor + time_us / _US
        elif code == "d":
            table[:, i] = anchor + (time_us + packed[name]) / _US
        else:
            table[:, i] = packed[name]
    return table


def _encode_steps(rows: np.ndarray) -> bytes | None:
    if rows.shape[1] != len(schema.STEP_COLUMNS):
        return None
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
    compact = np.zeros(len(rows), dtype=_STEP_ROW)
    compact["duration_us"] = np.where(regular, duration, 0)
    compact["input_wait_us"] = np.where(regular, wait, 0)
    compact["host_gap_us"] = np.where(regular, gap, 0)
    irregular = np.flatnonzero(~regular)
    exceptions = np.column_stack([irregular, rows[irregular]]).astype("<f8")
    return _pack(_STEPS_LAYOUT, len(rows), len(irregular), anchor, compact.tobytes() + exceptions.tobytes())


def _pack(layout_id: int, rows: int, exceptions: int, anchor: float, body: bytes) -> bytes:
    if len(body) >= _MIN_COMPRESS_BYTES:
        compressed = zlib.compress(body, 1)
        if len(compressed) <= 0.9 * len(body):
            return _HEAD.pack(MAGIC, layout_id | _ZLIB, rows, exceptions, anchor) + compressed
    return _HEAD.pack(MAGIC, layout_id, rows, exceptions, anchor) + body


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
