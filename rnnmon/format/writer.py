"""Writes rnnmon's summaries straight to a TensorBoard event file: no TensorFlow, any backend.

Tables are packed (`rnnmon.format.packing`, in the layouts `rnnmon.format.series` declares): 12 bytes a step instead
of 56; each tag's metadata names its columns and their storage, so readers map them by name. The values added
between two `flush()` calls go into as few events as possible: one event holds every table of a chunk (one per
tag) and one holds the chunk's scalars, so the framing is paid once per chunk, not per tag. Tensor tags are
stamped with a strictly increasing sequence (milliseconds since the epoch) so chunks from one or several
processes never share a step; scalars use the training step, as the Scalars tab expects.

A write that fails (a full disk) never raises: it is logged once, the file is cut back to its last whole
record, and the unwritten events stay in memory (the newest 64 MiB) for the next `flush()`, which logs the
recovery. A run folder deleted during the fit is recreated with a warning; the file starts again with every tag's
metadata and the latest run description and findings, so readers can use what follows.

With `segment_s` / `segment_bytes` (a log directory on object storage, `rnnmon.storage`), a new event file (a
segment) is started after a flush once the current one is that old or that large; it too starts with every tag's
metadata and the latest run description and findings, so each finished segment is whole and never changes again.

Example:
    >>> writer = SummaryWriter("runs/exp1/rnnmon")
    >>> writer.table(STEPS_TAG, rows)          # float64 [n, 7]
    >>> writer.scalar("rnnmon/step_time_ms", 1.6, step=120)
    >>> writer.flush()                         # both in the file now
    >>> writer.close()
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata

from rnnmon.format import packing, series
from rnnmon.format.eventfile import EventFileAppender
from rnnmon.format.index_write import IndexWriter
from rnnmon.format.schema import FINDINGS_TAG, RUN_TAG, tensor_metadata

LOG = logging.getLogger("rnnmon")
_Chunk = tuple[np.ndarray, bytes | None, packing.Layout | None]  # a table's rows, packed bytes and their layout
_LATEST_WINS = (RUN_TAG, FINDINGS_TAG)  # tags whose latest value is the one read: rewritten into a new file


class SummaryWriter:
    """Appends rnnmon tensors and scalars to one event file in `run_dir`."""

    def __init__(self, run_dir: str, fmt: series.Format = series.FORMAT, *, segment_s: float | None = None,
                 segment_bytes: int | None = None) -> None:
        self.run_dir = run_dir
        self.format = fmt  # the declarations written: each table's columns, storage and layout
        self._file = EventFileAppender(run_dir)
        self._file.add(_header())
        self._index = IndexWriter(self._file.path)  # the reading index beside the file (rnnmon.format.index)
        self._segment_s, self._segment_bytes = segment_s, segment_bytes
        self._segment_start = time.monotonic()
        self._sequence = 0
        self._metadata: dict[str, summary_pb2.SummaryMetadata] = {}
        self._in_file: set[str] = set()  # tags whose metadata the current file already carries
        self._latest: dict[str, summary_pb2.Summary.Value] = {}
        self._failing = False
        self._tensors: event_pb2.Event | None = None  # the open chunk event, and its scalars' event
        self._scalars: event_pb2.Event | None = None
        self._lock = threading.Lock()

    def table(self, tag: str, rows: Any, **extra: Any) -> None:
        """One chunk of float64 rows for `tag`; `extra` goes into the tag's metadata (first write only)."""
        array = np.ascontiguousarray(rows, dtype=np.float64)
        if array.ndim == 2 and len(array) > packing.MAX_ROWS:
            for first in range(0, len(array), packing.MAX_ROWS):
                self.table(tag, array[first:first + packing.MAX_ROWS], **extra)
            return
        layout = packing.layout_of(tag, self.format)
        version = self.format.version
        packed = (packing.encode(tag, array, layout, planes=version >= packing.PLANES_VERSION,
                                 compact=version >= packing.COMPACT_VERSION) if layout is not None else None)
        if packed is not None:
            proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[packed])
        else:  # version 1's float64 table: phases, and chunks a packed layout cannot hold
            proto = tensor_pb2.TensorProto(
                dtype=types_pb2.DT_DOUBLE,
                tensor_shape=tensor_shape_pb2.TensorShapeProto(
                    dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in array.shape]),
                tensor_content=array.tobytes())
        self._add(tag, proto, lambda: tensor_metadata(tag, self.format, **extra), rows=(array, packed, layout))

    def json(self, tag: str, value: Any) -> None:
        """A JSON document (run description, findings, alerts) as a string tensor."""
        proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[json.dumps(value).encode()])
        self._add(tag, proto, lambda: tensor_metadata(tag, self.format))

    def scalar(self, tag: str, value: float, step: int) -> None:
        """A standard scalar, shown in TensorBoard's Scalars tab beside the loss."""
        proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[value])
        self._add(tag, proto, lambda: scalar_metadata.create_summary_metadata(display_name="", description=""),
                  step)

    @property
    def failing(self) -> bool:
        """The last write failed: what was added since is held in memory."""
        return self._failing

    def flush(self) -> bool:
        """Write everything added so far; False (logged once) while the disk refuses it."""
        with self._lock:
            self._close_events()
            if self._file.lost():
                self._recreate()
            if self._file.dropped:
                self._index.abandon("the event file dropped records while the disk refused them")
            try:
                self._file.flush()
                self._index.flush()
            except OSError as error:
                if not self._failing:
                    self._failing = True
                    LOG.error("rnnmon: cannot write to %s (%s); keeping the newest 64 MiB in memory and retrying "
                              "at every flush.", self.run_dir, error)
                return False
            if self._failing:
                self._failing = False
                LOG.warning("rnnmon: writing to %s again; %s.", self.run_dir,
                            f"{self._file.dropped} records were dropped meanwhile" if self._file.dropped
                            else "nothing was lost")
            if self._segment_due():
                self._file.abandon()  # all written: the segment is finished
                self._file = EventFileAppender(self.run_dir)
                self._index = IndexWriter(self._file.path)
                self._segment_start = time.monotonic()
                self._start_file([])
            return True

    def _segment_due(self) -> bool:
        if self._segment_s is not None and time.monotonic() - self._segment_start >= self._segment_s:
            return True
        return self._segment_bytes is not None and self._file.size() >= self._segment_bytes

    def close(self) -> bool:
        """Flush and close the file; False when something could not be written (it is then dropped)."""
        self._segment_s = self._segment_bytes = None  # the last file: no new segment after it
        written = self.flush()
        with self._lock:
            if not written:
                LOG.error("rnnmon: %d records could not be written to %s and are lost.", self._file.pending,
                          self.run_dir)
            self._file.abandon()
        return written

    def _recreate(self) -> None:
        LOG.warning("rnnmon: %s was deleted during the fit; recreating it (what it held is lost).", self.run_dir)
        self._index.abandon("the run folder was recreated")
        self._start_file(self._file.reopen())

    def _start_file(self, records: list[bytes]) -> None:
        """A new file's first records: the header, `records` not yet written, and the latest documents, each tag's
        first value with its metadata."""
        pending = [event_pb2.Event.FromString(record) for record in records]
        self._in_file.clear()
        self._file.add(_header())
        for event in [*(e for e in pending if not e.file_version),
                      *(event_pb2.Event(wall_time=time.time(), step=self._next_sequence(), summary=summary_pb2.Summary(
                          value=[value])) for value in self._latest.values())]:
            for value in event.summary.value:
                self._describe(value)
            self._file.add(event.SerializeToString())

    def _describe(self, value: summary_pb2.Summary.Value) -> None:
        """Metadata goes with the first value of each tag in a file."""
        if value.tag not in self._in_file:
            self._in_file.add(value.tag)
            value.metadata.CopyFrom(self._metadata[value.tag])
        elif value.HasField("metadata"):
            value.ClearField("metadata")

    def _next_sequence(self) -> int:
        self._sequence = max(self._sequence + 1, int(time.time() * 1000))
        return self._sequence

    def _add(self, tag: str, proto: tensor_pb2.TensorProto, metadata: Callable[[], summary_pb2.SummaryMetadata],
             step: int | None = None, rows: _Chunk | None = None) -> None:
        """Add one value to the open event of its kind; a tag already in that event starts a new one. A table's
        `rows` (with its packed bytes and their layout) go to the index, staged with the event that holds them."""
        value = summary_pb2.Summary.Value(tag=tag, tensor=proto)
        with self._lock:  # the training thread and the background thread both write
            if tag not in self._metadata:
                self._metadata[tag] = metadata()
            self._describe(value)
            if tag in _LATEST_WINS:
                self._latest[tag] = value
            if step is None:
                if self._tensors is None or any(v.tag == tag for v in self._tensors.summary.value):
                    self._close_events(scalars=False)
                    self._tensors = event_pb2.Event(wall_time=time.time(), step=self._next_sequence())
                self._tensors.summary.value.append(value)
                if rows is not None:
                    self._index.table(tag, *rows, self._tensors.step)
                else:  # a document: the index lists its event, so a summary reads it without a scan
                    self._index.document(self._tensors.step)
            else:
                if self._scalars is None or self._scalars.step != step or any(
                        v.tag == tag for v in self._scalars.summary.value):
                    self._close_events(tensors=False)
                    self._scalars = event_pb2.Event(wall_time=time.time(), step=step)
                self._scalars.summary.value.append(value)

    def _close_events(self, tensors: bool = True, scalars: bool = True) -> None:
        if tensors and self._tensors is not None:
            record = self._tensors.SerializeToString()
            self._index.located(self._tensors.step, self._file.add(record), len(record) + 16)
            self._tensors = None
        if scalars and self._scalars is not None:
            self._file.add(self._scalars.SerializeToString())
            self._scalars = None


def _header() -> bytes:
    return event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()
