"""A run's reading index: what a reader needs to draw any window of a run without visiting every step.

The writer thread writes it beside each event file at every flush (`IndexWriter`, fed by `SummaryWriter`), in
append-only files under `<run>/rnnmon-index/<event file's suffix>/` (no name holds "tfevents": TensorBoard never
loads them). Every file is a sequence of fixed-size little-endian records, each ending in the CRC-32 of its other
bytes, so a reader finds a record by its number and drops a torn last one:
- `dir.<series>`: one record per chunk holding rows of a drawn series: where its event lies in the event file
  (offset, framed length, event step), the series' rows in it, and their first and last time. A short window is
  read straight from those events, each checked against the index (length, checksums, event step): where they
  disagree, the data wins.
- `<series>.L<k>`: level k of a min/max pyramid of a drawn series (`steps`: input wait, compute and host gap in
  ms by begin time; `util<N>`, `sm<N>`: a GPU's utilization and SM activity). A level-0 record covers `BLOCK` rows
  (steps: `STEPS_BLOCK`), a level-k+1 record `FAN` level-k records; each keeps, per column, the row holding its
  minimum and the row holding its maximum (time, key and all columns). A window reads the level whose record count
  fits the points shown, and a one-sample spike is an extreme of its record at every level, so it is always drawn.
- `gaps.d<D>.c<C>.L<k>`, `phases.k<K>.L<k>`: interval coverage of one group (device and cause, phase kind): per
  record of `BLOCK` intervals (or `FAN` records), their count, first start, last start, last end and covered seconds.
- `dir.docs`: the events holding a document or phases (`rows` 0, times 0), and `digest`: the run digest's records
  (`rnnmon.format.digest_file`); a summary reads these (`rnnmon.format.digest_read`), `FileIndex` does not.

Rows a writer has not closed a level-0 record for yet (fewer than `BLOCK` per series) are read from the event file
through `dir.*`. A reader (`FileIndex`) takes the index as far as it goes, then the event file's bytes after the last
chunk it names, indexed in memory: a run whose index disagrees with its data is indexed in memory on first read, a
bounded batch of records at a time. A run written before the index existed (formats 1 and 2), or copied without it,
gets it built by its first reader and kept (`rnnmon.format.index_build`).

This module holds what the files are: their names, record types and checksums, and the series a table's rows
draw. Writing them: `rnnmon.format.index_write`; reading one event file's: `rnnmon.format.index_read` (what it
locates, checked: `rnnmon.format.index_located`); a run's windows: `rnnmon.format.index_query`.

Example:
    >>> index_folder("runs/exp1/rnnmon/events.out.tfevents.1.host")   # runs/exp1/rnnmon/rnnmon-index/1.host
    >>> dict(series_of(schema.STEPS_TAG, rows))["steps"]              # (time, key, values) drawn of a chunk
"""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from collections.abc import Iterator

import numpy as np

from rnnmon.format import schema
from rnnmon.format.eventfile import EVENT_FILE_MARK

INDEX_DIR = "rnnmon-index"
BLOCK = 64  # rows per level-0 record
# Steps: a level-0 record per 256 rows (64 until format version 4). A record keeps six whole rows (28 bytes each);
# at 64 rows that was 3 bytes a step, more than the event file's own row; readers take any block (records say their
# rows), and `/timeline` reads a steps window from its chunks for longer (indexed_timeline.RAW_STEP_CHUNKS).
STEPS_BLOCK = 256
FAN = 16  # level-k records per level-k+1 record
DRAWN_TAGS = (schema.STEPS_TAG, schema.PHASES_TAG, schema.GAPS_TAG)  # and the util and stats tags of every GPU
DOCUMENTS = "dir.docs"  # the events holding a document or phases (a summary reads them; `FileIndex` does not)
MIN_EVENT_BYTES = 16  # an event's framing alone: a chunk directory names at most one record per this many bytes
_SM = schema.STAT_COLUMNS.index("sm_activity_pct")
_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}
DIRECTORY = np.dtype([("offset", "<u8"), ("length", "<u4"), ("step", "<i8"), ("rows", "<u4"), ("t_first", "<f8"),
                      ("t_last", "<f8"), ("crc", "<u4")])
INTERVALS = np.dtype([("rows", "<u4"), ("t_first", "<f8"), ("s_last", "<f8"), ("t_last", "<f8"),
                      ("covered", "<f8"), ("crc", "<u4")])


def point_dtype(columns: int) -> np.dtype:
    """A pyramid record of a series of `columns` values: slot 2c holds column c's minimum row, 2c+1 its maximum."""
    slots = 2 * columns
    return np.dtype([("rows", "<u4"), ("t_first", "<f8"), ("t_last", "<f8"), ("time", "<f8", (slots,)),
                     ("key", "<f8", (slots,)), ("values", "<f4", (slots, columns)), ("crc", "<u4")])


def columns_of(series: str) -> int:
    return 3 if series == "steps" else 1


def block_of(series: str) -> int:
    """Rows per level-0 record of `series` as this writer writes them."""
    return STEPS_BLOCK if series == "steps" else BLOCK


def dtype_of(name: str) -> np.dtype:
    """The record type of index file `name`."""
    if name.startswith("dir."):
        return DIRECTORY
    series = name.rsplit(".L", 1)[0]
    return INTERVALS if series.startswith(("gaps.", "phases.")) else point_dtype(columns_of(series))


def index_folder(event_path: str) -> str:
    """The index folder of an event file: `<run>/rnnmon-index/<the file name after "tfevents.">`."""
    folder, name = os.path.split(event_path)
    return os.path.join(folder, INDEX_DIR, name.split(EVENT_FILE_MARK, 1)[-1].lstrip("."))


def cached_index_folder(event_path: str) -> str:
    """Where a reader keeps the index it built for an event file whose own folder cannot be written: under the
    user's cache directory (`$XDG_CACHE_HOME`, else `~/.cache`), `rnnmon/rnnmon-index/<hash of the file's real
    path>`."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(os.path.realpath(event_path).encode()).hexdigest()[:32]
    return os.path.join(root, "rnnmon", INDEX_DIR, key)


def found_index_folder(event_path: str) -> str:
    """The index folder a reader reads: beside the event file where there is one, else the one a reader built in
    the cache (`cached_index_folder`), else beside (none yet)."""
    beside = index_folder(event_path)
    if os.path.isdir(beside):
        return beside
    cached = cached_index_folder(event_path)
    return cached if os.path.isdir(cached) else beside


def drawn(tag: str) -> bool:
    return tag in DRAWN_TAGS or (tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX))
                                 and schema.device_of(tag) is not None)


def times(tag: str) -> slice:
    """The time columns of a drawn tag's rows."""
    if tag == schema.STEPS_TAG:
        return slice(2, 4)
    return slice(1, 3) if tag in (schema.GAPS_TAG, schema.PHASES_TAG) else slice(0, 1)


def dir_name(series: str) -> str:
    return "dir." + series


def seal(records: np.ndarray) -> np.ndarray:
    """Set each record's CRC over its other bytes."""
    raw = records.view(np.uint8).reshape(len(records), records.dtype.itemsize)
    records["crc"] = [zlib.crc32(row[:-4].tobytes()) for row in raw]
    return records


def intact(records: np.ndarray) -> bool:
    """Every record's CRC matches: record by record, or where there are many (a level of 14k records that a
    whole-run view of gaps reads: 6 ms record by record, 2 ms so) byte column by byte column of all at once."""
    size = records.dtype.itemsize
    if len(records) > 25 * size:
        return bool((_crc32_by_column(records) == records["crc"]).all())
    raw = memoryview(np.ascontiguousarray(records).view(np.uint8).reshape(-1))  # sliced without copies
    return all(zlib.crc32(raw[at:at + size - 4]) == crc
               for at, crc in zip(range(0, len(raw), size), records["crc"].tolist()))


def _crc32_by_column(records: np.ndarray) -> np.ndarray:
    """zlib's CRC-32 of each record's bytes but its last 4, computed for all records at once, a byte at a time."""
    raw = np.ascontiguousarray(records).view(np.uint8).reshape(len(records), records.dtype.itemsize)
    crc = np.full(len(records), 0xFFFFFFFF, dtype=np.uint32)
    for column in raw[:, :-4].T:
        crc = _CRC_TABLE[(crc ^ column) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc_table()  # zlib's CRC-32 (reflected polynomial 0xEDB88320), a byte at a time


INDEX_FILE = re.compile(r"dir\.(steps|util\d+|sm\d+|gaps\.d-?\d+\.c\d+|phases\.k\d+)"
                         r"|(steps|util\d+|sm\d+|gaps\.d-?\d+\.c\d+|phases\.k\d+)\.L\d+")



def empty_series(series: str) -> tuple[np.ndarray, ...]:
    if series.startswith(("gaps.", "phases.")):
        return np.empty(0), np.empty(0)
    return np.empty(0), np.empty(0), np.empty((0, columns_of(series)), dtype=np.float32)


def tag_of(series: str) -> str:
    if series == "steps":
        return schema.STEPS_TAG
    if series.startswith("util"):
        return f"{schema.UTIL_TAG_PREFIX}{series[4:]}"
    if series.startswith("sm"):
        return f"{schema.STATS_TAG_PREFIX}{series[2:]}"
    return schema.GAPS_TAG if series.startswith("gaps.") else schema.PHASES_TAG


def only_series(tag: str) -> str | None:
    """The one series a drawn tag's chunks hold (steps, a GPU's util or SM activity); None for the tables of
    intervals, whose groups are known only once a chunk is decoded."""
    if tag == schema.STEPS_TAG:
        return "steps"
    device = schema.device_of(tag)
    if device is None or not tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX)):
        return None
    return f"util{device}" if tag.startswith(schema.UTIL_TAG_PREFIX) else f"sm{device}"


# --- series: what is drawn, from a chunk of a table --------------------------------------------------------
def series_of(tag: str, rows: np.ndarray) -> Iterator[tuple[str, tuple[np.ndarray, ...]]]:
    """(series, (time, key, values)) for drawn points, (series, (start, end)) for intervals, of a table's rows."""
    for name, parts, _ in series_rows(tag, rows):
        yield name, parts


def series_rows(tag: str, rows: np.ndarray) -> Iterator[tuple[str, tuple[np.ndarray, ...], np.ndarray]]:
    """`series_of`, with the numbers of the rows each series took, in order."""
    if tag == schema.STEPS_TAG:
        used = np.flatnonzero(~np.isnan(rows[:, _S["host_gap_ms"]]))  # each fit's first step is its warm-up
        kept = rows[used]
        wait = kept[:, _S["input_wait_ms"]]
        values = np.column_stack([wait, 1e3 * (kept[:, _S["end"]] - kept[:, _S["begin"]]) - np.nan_to_num(wait),
                                  kept[:, _S["host_gap_ms"]]]).astype(np.float32)
        yield "steps", (kept[:, _S["begin"]], kept[:, _S["step"]].astype(np.float64), values), used
    elif tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX)):
        device = schema.device_of(tag)
        util = tag.startswith(schema.UTIL_TAG_PREFIX)
        value = rows[:, 1] if util else rows[:, _SM]
        used = np.flatnonzero(~np.isnan(value))
        yield (f"util{device}" if util else f"sm{device}"), (
            rows[used, 0], np.zeros(len(used)), value[used].astype(np.float32)[:, None]), used
    elif tag in (schema.GAPS_TAG, schema.PHASES_TAG):
        gaps = tag == schema.GAPS_TAG
        kinds = len(schema.GAP_CAUSES) if gaps else 1
        codes = ((rows[:, 0] + 1) * kinds + rows[:, 3]).astype(np.int64) if gaps else rows[:, 0].astype(np.int64)
        for code in np.flatnonzero(np.bincount(codes)).tolist():  # devices from -1, causes and kinds from 0
            used = np.flatnonzero(codes == code)
            name = f"gaps.d{code // kinds - 1}.c{code % kinds}" if gaps else f"phases.k{code}"
            yield name, (rows[used, 1], rows[used, 2]), used
