"""Writes rnnmon's summaries with TensorBoard's own event-file writer: no TensorFlow ops, any backend.

Tensor tags are stamped with a strictly increasing sequence (milliseconds since the epoch) so chunks from
one or several processes never share a step; scalars use the training step, as the Scalars tab expects.

Example:
    >>> writer = SummaryWriter("runs/exp1/rnnmon")
    >>> writer.table(STEPS_TAG, rows)          # float64 [n, 7]
    >>> writer.scalar("rnnmon/step_time_ms", 1.6, step=120)
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
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from rnnmon.metadata import tensor_metadata


class SummaryWriter:
    """Appends rnnmon tensors and scalars to one event file in `run_dir`."""

    def __init__(self, run_dir: str) -> None:
        self._writer = EventFileWriter(run_dir, max_queue_size=1000, flush_secs=5)
        self._sequence = 0
        self._described: set[str] = set()
        self._lock = threading.Lock()

    def table(self, tag: str, rows: Any, **extra: Any) -> None:
        """One chunk of float64 rows for `tag`; `extra` goes into the tag's metadata (first write only)."""
        array = np.ascontiguousarray(rows, dtype=np.float64)
        proto = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_DOUBLE,
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in array.shape]),
            tensor_content=array.tobytes(),
        )
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
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def _add(self, tag: str, proto: tensor_pb2.TensorProto,
             metadata: Callable[[], summary_pb2.SummaryMetadata], step: int | None = None) -> None:
        """Append one value; metadata goes with a tag's first value, tensor tags get the next sequence step."""
        value = summary_pb2.Summary.Value(tag=tag, tensor=proto)
        with self._lock:  # the training thread and the background thread both write
            if tag not in self._described:
                self._described.add(tag)
                value.metadata.CopyFrom(metadata())
            if step is None:
                self._sequence = step = max(self._sequence + 1, int(time.time() * 1000))
            self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                                   summary=summary_pb2.Summary(value=[value])))
