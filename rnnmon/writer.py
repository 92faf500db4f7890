"""Writes rnnmon's summaries straight to a TensorBoard event file: no TensorFlow, any backend.

Tables are packed (summary format version 2, `rnnmon.packing`): 12 bytes a step instead of 56. The values added
between two `flush()` calls go into as few events as possible: one event holds every table of a chunk (one per
tag) and one holds the chunk's scalars, so the framing is paid once per chunk, not per tag. Tensor tags are
stamped with a strictly increasing sequence (milliseconds since the epoch) so chunks from one or several
processes never share a step; scalars use the training step, as the Scalars tab expects.

A write that fails (a full disk) raises from `flush()`; the file is cut back to its last whole record and the
unwritten events stay queued for the next `flush()`.

Example:
    >>> writer = SummaryWriter("runs/exp1/rnnmon")
    >>> writer.table(STEPS_TAG, rows)          # float64 [n, 7]
    >>> writer.scalar("rnnmon/step_time_ms", 1.6, step=120)
    >>> writer.flush()                         # both in the file now
    >>> writer.close()
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata

from rnnmon import packing
from rnnmon.eventfile import EventFileAppender
from rnnmon.metadata import tensor_metadata


class SummaryWriter:
    """Appends rnnmon tensors and scalars to one event file in `run_dir`."""

    def __init__(self, run_dir: str) -> None:
        self._file = EventFileAppender(run_dir)
        self._file.add(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        self._sequence = 0
        self._described: set[str] = set()
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
        packed = packing.encode(tag, array) if packing.packable(tag) else None
        if packed is not None:
            proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[packed])
        else:  # version 1's float64 table: phases, and chunks a packed layout cannot hold
            proto = tensor_pb2.TensorProto(
                dtype=types_pb2.DT_DOUBLE,
                tensor_shape=tensor_shape_pb2.TensorShapeProto(
                    dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in array.shape]),
                tensor_content=array.tobytes())
        self._add(tag, proto, lambda: tensor_metadata(tag, **extra))

    def json(self, tag: str, value: Any) -> None:
        """A JSON document (run description, findings, alerts) as a string tensor."""
        proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[json.dumps(value).encode()])
        self._add(tag, proto, lambda: tensor_metadata(tag))

    def scalar(self, tag: str, value: float, step: int) -> None:
        """A standard scalar, shown in TensorBoard's Scalars tab beside the loss."""
        proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[value])
        self._add(tag, proto, lambda: scalar_metadata.create_summary_metadata(display_name=tag, description=""),
                  step)

    def flush(self) -> None:
        with self._lock:
            self._close_events()
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._close_events()
            self._file.close()

    def _add(self, tag: str, proto: tensor_pb2.TensorProto,
             metadata: Callable[[], summary_pb2.SummaryMetadata], step: int | None = None) -> None:
        """Add one value to the open event of its kind; a tag already in that event starts a new one."""
        value = summary_pb2.Summary.Value(tag=tag, tensor=proto)
        with self._lock:  # the training thread and the background thread both write
            if tag not in self._described:
                self._described.add(tag)
                value.metadata.CopyFrom(metadata())
            if step is None:
                if self._tensors is None or any(v.tag == tag for v in self._tensors.summary.value):
                    self._close_events(scalars=False)
                    self._sequence = max(self._sequence + 1, int(time.time() * 1000))
                    self._tensors = event_pb2.Event(wall_time=time.time(), step=self._sequence)
                self._tensors.summary.value.append(value)
            else:
                if self._scalars is None or self._scalars.step != step or any(
                        v.tag == tag for v in self._scalars.summary.value):
                    self._close_events(tensors=False)
                    self._scalars = event_pb2.Event(wall_time=time.time(), step=step)
                self._scalars.summary.value.append(value)

    def _close_events(self, tensors: bool = True, scalars: bool = True) -> None:
        if tensors and self._tensors is not None:
            self._file.add(self._tensors.SerializeToString())
            self._tensors = None
        if scalars and self._scalars is not None:
            self._file.add(self._scalars.SerializeToString())
            self._scalars = None
