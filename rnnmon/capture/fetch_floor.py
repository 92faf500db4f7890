"""The fetch floor: what `next(iterator)` costs for a batch that is already there.

Even a prefetched batch costs an eager op on the host (about 0.3-0.5 ms on a 2-core CPU): on a 2 ms step
that alone reads as 15-25% "input wait", yet no pipeline change removes it. rnnmon measures it once per fit
on an in-memory dataset of the step's own first batch (same element spec, nothing to wait for), and reports
only the wait beyond it as waiting for the pipeline; a floor that is large next to the step is a small-step
finding of its own.

Example:
    >>> floor_s = fetch_floor_s(first_batch)       # a (features, labels) tuple of tensors
    >>> round(floor_s * 1e3, 2)
    0.31
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

SAMPLES = 25


def fetch_floor_s(batch: Any, samples: int = SAMPLES) -> float:
    """Median seconds of `next()` on a tf.data iterator whose next batch (a copy of `batch`) is ready; NaN if
    `batch` is not something tf.data can hold (e.g. per-replica values of a distribution strategy)."""
    import tensorflow as tf

    try:
        iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
        next(iterator)  # the first fetch starts the iterator's threads
        durations = []
        for _ in range(samples):
            start = time.perf_counter()
            next(iterator)
            durations.append(time.perf_counter() - start)
    except Exception:  # measuring must never stop training
        return math.nan
    return statistics.median(durations)
