"""The fetch floor: what `next(iterator)` costs for a batch that is already there.

Even a prefetched batch costs an eager op on the host (about 0.3-0.5 ms on a 2-core CPU): on a 2 ms step
that alone reads as 15-25% "input wait", yet no pipeline change removes it. rnnmon measures it once per fit
on an in-memory dataset of the step's own first batch (same element spec, nothing to wait for), and reports
only the wait beyond it as waiting for the pipeline; a floor that is large next to the step is a small-step
finding of its own.

Under a `tf.distribute` strategy `fit` reads a distributed iterator, which splits each batch across the
replicas and, where the batch shape is not static (no `drop_remainder`), checks every replica for a partial
last batch on each call: 1-2.8 ms a ready batch on two logical CPUs, against 0.1-0.4 ms on a plain iterator.
The floor is then measured the same way through a distributed iterator of the same strategy and options,
with the same partial-batch handling, over the first batch put back together; what it costs beyond the plain
floor is the distribution's split, and of that, what the partial-batch check costs. Nothing is read from the
iterator `fit` uses.

Example:
    >>> fetch_floors(first_batch, iterator)       # the step's first batch and the iterator it came from
    {'fetch_floor_ms': 2.07, 'distributed_split_ms': 1.92, 'partial_batch_ms': 1.01}
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

SAMPLES = 25


def fetch_floors(batch: Any, iterator: Any) -> dict[str, float]:
    """Run-description fields in ms: `fetch_floor_ms` (a ready batch through an iterator like `iterator`) and,
    for a distributed iterator, `distributed_split_ms` and `partial_batch_ms`; what could not be measured is
    left out."""
    import tensorflow as tf

    if not isinstance(iterator, tf.distribute.DistributedIterator):
        return _ms(fetch_floor_s=fetch_floor_s(batch))
    try:
        strategy = iterator._strategy
        whole = tf.nest.map_structure(lambda v: tf.concat(strategy.experimental_local_results(v), axis=0), batch)
        ready = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(whole).repeat(),
                                                         options=getattr(iterator, "_options", None))
        copy = iter(ready)
    except Exception:  # measuring must never stop training
        return {}
    plain_s = fetch_floor_s(whole)
    partial = bool(getattr(iterator, "_enable_get_next_as_optional", False))
    copy._enable_get_next_as_optional = partial
    floor_s = _median_next_s(copy)
    copy._enable_get_next_as_optional = False
    unchecked_s = _median_next_s(copy) if partial else floor_s
    return _ms(fetch_floor_s=floor_s, distributed_split_s=max(floor_s - plain_s, 0.0),
               partial_batch_s=max(floor_s - unchecked_s, 0.0))


def fetch_floor_s(batch: Any, samples: int = SAMPLES) -> float:
    """Median seconds of `next()` on a tf.data iterator whose next batch (a copy of `batch`) is ready; NaN if
    `batch` is not something tf.data can hold."""
    import tensorflow as tf

    try:
        iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    except Exception:  # measuring must never stop training
        return math.nan
    return _median_next_s(iterator, samples)


def _median_next_s(iterator: Any, samples: int = SAMPLES) -> float:
    try:
        next(iterator)  # the first fetch starts the iterator's threads
        durations = []
        for _ in range(samples):
            start = time.perf_counter()
            next(iterator)
            durations.append(time.perf_counter() - start)
    except Exception:  # measuring must never stop training
        return math.nan
    return statistics.median(durations)


def _ms(**seconds: float) -> dict[str, float]:
    return {name[:-2] + "_ms": round(value * 1e3, 4) for name, value in seconds.items() if not math.isnan(value)}
