"""Decoding one rnnmon value: the checks every record passes before it is used, and a table's chunks decoded and
mapped by column name. Below the reader (`rnnmon.format.reader`), the index (`rnnmon.format.index_read`) and the
digest's reader (`rnnmon.format.digest_read`), which decode values alike.

Every value is untrusted: its type, shape and size are checked before anything is allocated for it (a chunk holds
at most `packing.MAX_ROWS` rows, and its bytes must be there to back them), then its rows or its JSON document.
A value that fails raises `InvalidRecord` (or one of `INVALID`) saying what and where.

Example:
    >>> stored = stored_by(value)                     # how a value's metadata describes its tag (or None)
    >>> rows, counts, kept, failed = decode_chunks(schema.STEPS_TAG, tensors, stored)
    >>> raw_value(schema.STEPS_TAG, tensor)           # one chunk, or InvalidRecord
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any

import numpy as np
from tensorboard.compat.proto import types_pb2

from rnnmon.format import packing, schema

MAX_DOCUMENT_BYTES = 1 << 20  # a run description, findings or alerts chunk: a few KiB in practice
_SEVERITIES = ("info", "warning", "critical")
_DT_STRING, _DT_DOUBLE = types_pb2.DT_STRING, types_pb2.DT_DOUBLE


class InvalidRecord(ValueError):
    """A value that does not fit rnnmon's format; the message says what and where."""


INVALID = (InvalidRecord, ValueError, TypeError, UnicodeDecodeError)  # what a bad value raises while checked


def by_name(tag: str, rows: np.ndarray, stored: tuple[str, ...]) -> tuple[np.ndarray, list[str]]:
    """`rows`, whose columns are named `stored`, in this reader's columns of `tag` (a column it lacks is NaN), and
    the stored columns it does not know (skipped)."""
    columns = schema.columns_for(tag) or ()
    if stored == columns:
        return rows, []
    out = np.full((len(rows), len(columns)), np.nan)
    for i, name in enumerate(columns):
        if name in stored:
            out[:, i] = rows[:, stored.index(name)]
    return out, [name for name in stored if name not in columns]


@dataclasses.dataclass(frozen=True)
class Stored:
    """How a tag's values were written, from its metadata: the columns of a float64 table, and the layout of a
    packed chunk (None, and `problem` saying why, when the metadata describes one this reader cannot decode)."""

    columns: tuple[str, ...]
    layout: packing.Layout | None
    problem: str = ""


def stored_as(tag: str, content: dict[str, Any]) -> Stored:
    """How `tag`'s values were written, from its metadata content; this reader's own columns where the content names
    none."""
    names = content.get("columns")
    columns = schema.columns_for(tag) or ()
    if isinstance(names, list) and 0 < len(names) <= packing.MAX_COLUMNS and all(isinstance(n, str) for n in names):
        columns = tuple(names)
    try:
        return Stored(columns, packing.stored_layout(tag, content))
    except packing.FormatError as error:
        return Stored(columns, None, f"cannot decode packed chunks as the metadata describes them: {error}")



DOCUMENT, IGNORED, BAD_DEVICE = -1, -2, -3


@functools.lru_cache(maxsize=1024)
def table_width(tag: str) -> int:
    """The column count of `tag`'s table, or what else the tag is: a document, unknown, a malformed device tag."""
    if tag == schema.RUN_TAG or tag in DOCUMENT_CHECKS:
        return DOCUMENT
    columns = schema.columns_for(tag)
    if columns is None:
        return IGNORED
    if tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX)) and schema.device_of(tag) is None:
        return BAD_DEVICE
    return len(columns)


def marked_event(record: bytes, marks: tuple[bytes, ...]) -> Any:
    """The event in `record` where it names one of `marks` (tags, as bytes) and decodes; else None."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    if not any(mark in record for mark in marks):
        return None
    try:
        return event_pb2.Event.FromString(record)
    except DecodeError:
        return None


def stored_by(value: Any) -> Stored | None:
    """How an rnnmon summary value's metadata describes its tag (the first value of a tag in a file carries it)."""
    if value.HasField("metadata") and value.metadata.plugin_data.plugin_name == schema.PLUGIN_NAME:
        return stored_as(value.tag, schema.parse_content(value.metadata.plugin_data.content))
    return None


def raw_from_proto(tensor: Any) -> bytes | np.ndarray:
    """A packed chunk or document (bytes) or a v1 float64 table, from a TensorProto, checked before it is built."""
    dtype, dim = tensor.dtype, tensor.tensor_shape.dim
    if dtype == _DT_STRING:
        strings = tensor.string_val
        if len(strings) != 1 or (dim and any(d.size != 1 for d in dim)):
            raise InvalidRecord(f"a string tensor of shape {[d.size for d in dim]} where one string belongs")
        return strings[0]
    if dtype != _DT_DOUBLE:
        raise InvalidRecord(f"dtype {dtype} where float64 ({_DT_DOUBLE}) or string belongs")
    dims = [d.size for d in dim]
    if len(dims) != 2 or not 0 <= dims[0] <= packing.MAX_ROWS or not 0 < dims[1] <= 64:
        raise InvalidRecord(f"shape {dims}: a table is [rows <= {packing.MAX_ROWS}, columns]")
    count = dims[0] * dims[1]
    if tensor.tensor_content:
        if len(tensor.tensor_content) != 8 * count:
            raise InvalidRecord(f"shape {dims} needs {8 * count} bytes, the record holds {len(tensor.tensor_content)}")
        return np.frombuffer(tensor.tensor_content, dtype="<f8").reshape(dims)
    if len(tensor.double_val) != count:
        raise InvalidRecord(f"shape {dims} needs {count} values, the record holds {len(tensor.double_val)}")
    return np.asarray(tensor.double_val, dtype=np.float64).reshape(dims)


def raw_from_array(value: Any) -> bytes | np.ndarray:
    """The same, from the array TensorBoard's data provider made of the value."""
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind in "SU":
        if array.size != 1:
            raise InvalidRecord(f"a string tensor of shape {list(array.shape)} where one string belongs")
        item = array.reshape(-1)[0]
        return item if isinstance(item, bytes) else str(item).encode()
    if array.ndim != 2 or array.shape[0] > packing.MAX_ROWS or not 0 < array.shape[1] <= 64:
        raise InvalidRecord(f"shape {list(array.shape)}: a table is [rows <= {packing.MAX_ROWS}, columns]")
    if array.dtype.kind != "f":
        raise InvalidRecord(f"dtype {array.dtype} where float64 or string belongs")
    return array


def check_rows(tag: str, rows: np.ndarray) -> None:
    """Values the format rules out: non-finite times and counters, out-of-range kinds, causes and devices."""
    def whole(column: np.ndarray, lo: float, hi: float) -> bool:
        return bool(np.isfinite(column).all() and (column == np.rint(column)).all()
                    and (column >= lo).all() and (column <= hi).all())

    if tag == schema.STEPS_TAG:
        s = {name: rows[:, i] for i, name in enumerate(schema.STEP_COLUMNS)}
        if not (np.isfinite(rows[:, :4]).all() and whole(s["batches"], 1, 2**31) and whole(s["step"], 0, 2**53)
                and whole(s["epoch"], 0, 2**31)):
            raise InvalidRecord("a step row with a non-finite or fractional step, epoch, time or batch count")
    elif tag == schema.PHASES_TAG:
        if not (whole(rows[:, 0], 0, len(schema.PHASE_KINDS) - 1) and np.isfinite(rows[:, 1:]).all()):
            raise InvalidRecord(f"a phase with a kind outside 0..{len(schema.PHASE_KINDS) - 1} or a non-finite time")
    elif tag == schema.GAPS_TAG:
        if not (whole(rows[:, 0], schema.STEP_DEVICE, 2**16) and whole(rows[:, 3], 0, len(schema.GAP_CAUSES) - 1)
                and np.isfinite(rows[:, 1:3]).all() and (rows[:, 2] >= rows[:, 1]).all()):
            raise InvalidRecord(f"a gap with a device below {schema.STEP_DEVICE}, a cause outside "
                                f"0..{len(schema.GAP_CAUSES) - 1}, or a bad interval")
    elif not np.isfinite(rows[:, 0]).all():
        raise InvalidRecord("a row with a non-finite time")


def json_document(value: bytes | np.ndarray) -> Any:
    if not isinstance(value, bytes):
        raise InvalidRecord("a table where a JSON document belongs")
    if len(value) > MAX_DOCUMENT_BYTES:
        raise InvalidRecord(f"a JSON document of {len(value)} bytes, over the {MAX_DOCUMENT_BYTES}-byte limit")
    try:
        return json.loads(value.decode("utf-8"))
    except RecursionError:
        raise InvalidRecord("a JSON document nested too deeply") from None
    except ValueError as error:
        raise InvalidRecord(f"not JSON: {error}") from None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_DESCRIPTION_TYPES: dict[str, tuple[type, ...]] = {
    "status": (str,), "backend": (str,), "keras": (str,), "host": (str,), "input_wait": (str,), "input_kind": (str,),
    "nvml": (str,), "gpus": (list,), "worker": (str,), "thresholds": (dict,), "callback_hooks_s": (dict,),
    "trial": (dict,), "input_cache": (str,)}


def check_description(doc: dict[str, Any]) -> None:
    for key, types in _DESCRIPTION_TYPES.items():
        if doc.get(key) is not None and not isinstance(doc[key], types):
            raise InvalidRecord(f"run description field {key!r} is a {type(doc[key]).__name__}")
    for key in ("start", "end", "idle_pct", "steps", "steps_per_execution", "fetch_floor_ms", "callback_steps",
                "callback_batches", "distributed_split_ms", "partial_batch_ms"):
        if doc.get(key) is not None and not is_number(doc[key]):
            raise InvalidRecord(f"run description field {key!r} is not a finite number: {doc[key]!r:.40}")


def _check_finding(item: Any) -> None:
    fields = ("code", "severity", "where", "message", "advice")
    if not isinstance(item, dict) or set(item) != set(fields) or not all(isinstance(item[f], str) for f in fields):
        raise InvalidRecord(f"a finding that is not {{{', '.join(fields)}}} strings: {str(item)!r:.60}")
    if item["severity"] not in _SEVERITIES:
        raise InvalidRecord(f"a finding with severity {item['severity']!r:.30}, not one of {', '.join(_SEVERITIES)}")


def _check_alert(item: Any) -> None:
    if not isinstance(item, dict):
        raise InvalidRecord(f"an alert that is a {type(item).__name__}, not a JSON object")
    for key in ("rule", "state", "message"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise InvalidRecord(f"alert field {key!r} is not a string")
    for key in ("start", "end", "value", "threshold"):
        number = item.get(key)
        if number is not None and not (is_number(number) or (key in ("value", "threshold") and number != number)):
            raise InvalidRecord(f"alert field {key!r} is not a number")
    device = item.get("device")
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise InvalidRecord("alert field 'device' is not an integer")


def _check_shape(item: Any) -> None:
    """{"step", "time", "shapes"}: a step number, Unix seconds, and a list of shapes (lists of sizes or None)."""
    if not isinstance(item, dict) or not is_number(item.get("step")) or not is_number(item.get("time")):
        raise InvalidRecord(f"an input shape record without a step and a time: {str(item)!r:.60}")
    shapes = item.get("shapes")
    if not isinstance(shapes, list) or not all(
            shape is None or (isinstance(shape, list) and all(size is None or is_number(size) for size in shape))
            for shape in shapes):
        raise InvalidRecord(f"input shapes that are not lists of sizes: {str(shapes)!r:.60}")


def _check_compile(item: Any) -> None:
    """{"step", "time", "duration_s", "count", "seconds", "source", "shapes"} (rnnmon.capture.compiles)."""
    if not isinstance(item, dict) or not all(is_number(item.get(key)) for key in ("step", "time", "duration_s",
                                                                                   "count")):
        raise InvalidRecord(f"a compile record without a step, time, duration and count: {str(item)!r:.60}")
    if not (item.get("seconds") is None or is_number(item["seconds"])) or not isinstance(item.get("source"), str):
        raise InvalidRecord(f"a compile record whose seconds or source are off: {str(item)!r:.60}")
    if item.get("shapes") is not None:
        _check_shape({"step": 0, "time": 0, "shapes": item["shapes"]})


def _check_shape_steps(item: Any) -> None:
    """{"shapes", "steps", "plain_steps", "plain_s"}: one input shape's steps in a chunk and what they cost."""
    if not isinstance(item, dict) or not all(is_number(item.get(key)) for key in ("steps", "plain_steps",
                                                                                   "plain_s")):
        raise InvalidRecord(f"a shape's steps without their counts and cost: {str(item)!r:.60}")
    _check_shape({"step": 0, "time": 0, "shapes": item.get("shapes")})


DOCUMENT_CHECKS = {schema.FINDINGS_TAG: _check_finding, schema.ALERTS_TAG: _check_alert,
                    schema.SHAPES_TAG: _check_shape, schema.COMPILES_TAG: _check_compile,
                    schema.SHAPE_STEPS_TAG: _check_shape_steps}



def raw_value(tag: str, tensor: Any, stored: Stored | None = None) -> np.ndarray:
    """One table chunk of `tag` from its TensorProto, as float64 rows in this reader's columns, checked as
    `RunReader` checks it (shape and size first, then the rows); InvalidRecord or packing.FormatError when it fails.
    `stored`: how the chunk's file describes the tag (`stored_as`), default as this reader writes it."""
    rows, _, _, failed = decode_chunks(tag, [raw_from_proto(tensor)], stored)
    if failed:
        raise InvalidRecord(failed[0][1])
    return rows


def decode_chunks(tag: str, tensors: list[Any], stored: Stored | None = None
                  ) -> tuple[np.ndarray, list[int], list[int], list[tuple[int, str]]]:
    """Table chunks of `tag` (TensorProtos, or what `raw_from_proto` made of them) decoded, mapped by column name
    and checked together, as `RunReader` does: (their rows concatenated, row count and index of each chunk kept,
    (index, error) of each refused). `stored`: how their file describes the tag (`stored_as`), default as this
    reader writes it."""
    stored = stored or stored_as(tag, {})
    width = table_width(tag)
    raws, failed = [], []
    for index, tensor in enumerate(tensors):
        try:
            raw = tensor if isinstance(tensor, (bytes, np.ndarray)) else raw_from_proto(tensor)
            if isinstance(raw, bytes) and not packing.is_packed(raw):
                raise InvalidRecord("a string where a table belongs")
            if isinstance(raw, bytes) and stored.problem:
                raise InvalidRecord(stored.problem)
            if not isinstance(raw, bytes):
                if raw.shape[1] != len(stored.columns):
                    raise InvalidRecord(f"expected rows of {len(stored.columns)} columns, found shape {raw.shape}")
                raw = by_name(tag, raw, stored.columns)[0]
            raws.append((index, raw))
        except INVALID as error:
            failed.append((index, str(error)))
    tables, kept = [], []
    packed = [(index, raw) for index, raw in raws if isinstance(raw, bytes)]
    if packed:
        rows, decoded, errors = packing.decode_many(tag, [raw for _, raw in packed], stored.layout)
        rows = by_name(tag, rows, stored.layout.columns if stored.layout else stored.columns)[0]
        failed += [(packed[i][0], str(error)) for i, error in errors]
        starts = np.cumsum([0, *(count for _, count in decoded)])
        tables += [(packed[i][0], rows[starts[n]:starts[n + 1]]) for n, (i, _) in enumerate(decoded)]
    tables += [(index, np.asarray(raw, dtype=np.float64)) for index, raw in raws if not isinstance(raw, bytes)]
    tables.sort(key=lambda pair: pair[0])
    good = []
    try:
        check_rows(tag, np.concatenate([t for _, t in tables]) if tables else np.empty((0, width)))
        good = tables
    except InvalidRecord:  # rare: find the culprits chunk by chunk
        for index, table in tables:
            try:
                check_rows(tag, table)
                good.append((index, table))
            except InvalidRecord as error:
                failed.append((index, str(error)))
    kept = [index for index, _ in good]
    rows = np.concatenate([t for _, t in good]) if good else np.empty((0, width))
    return rows, [len(t) for _, t in good], kept, sorted(failed)
