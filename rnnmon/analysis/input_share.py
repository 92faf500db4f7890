"""How much of a run's step time went to waiting for the input pipeline, judged on robust statistics.

A step's measured wait includes the fetch floor (what `next()` costs for a ready batch, see
`rnnmon.capture.fetch_floor`), which no pipeline change removes; only the wait beyond it counts as waiting for the
pipeline. The share leaves out the steps with the longest waits (the 2 longest, or the longest 5% in a long
run): a handful of early waits (a shuffle buffer filling, a first file opening) must not make a run
input-bound, while a stall that recurs every few steps still does.

What removing the wait gives is predicted on the fit's training time (rnnmon.analysis.fit_time.training_without):
the fit after its warm-up, less the whole wait beyond the floor.

Example:
    >>> excess = pipeline_wait_s(wait_s, batches, floor_s=0.0004)
    >>> robust_share(excess, step_s)          # 0.41: 41% of step time waits for the pipeline
"""

from __future__ import annotations

import math

import numpy as np

OUTLIERS_MIN, OUTLIERS_FRACTION = 2, 0.05


def pipeline_wait_s(wait_s: np.ndarray, batches: np.ndarray, floor_s: float) -> np.ndarray:
    """Each step's wait beyond the fetch floor of its batches (NaN floor: the whole wait)."""
    floor = 0.0 if math.isnan(floor_s) else floor_s
    return np.maximum(wait_s - floor * np.maximum(batches, 1), 0.0)


def robust_share(part_s: np.ndarray, whole_s: np.ndarray) -> float | None:
    """sum(part) / sum(whole) over the steps, less the ones with the largest `part`; None without steps."""
    if not len(part_s) or np.isnan(part_s).all():
        return None
    part_s = np.nan_to_num(part_s)
    drop = max(OUTLIERS_MIN, math.ceil(OUTLIERS_FRACTION * len(part_s)))
    keep = _smallest(part_s, len(part_s) - drop) if len(part_s) > 2 * drop else np.arange(len(part_s))
    whole = float(whole_s[keep].sum())
    return round(float(part_s[keep].sum()) / whole, 4) if whole > 0 else None


def _smallest(values: np.ndarray, count: int) -> np.ndarray:
    """A mask of the `count` smallest `values`; of equal values at the cut, the earliest (a stable sort's choice).

    One partition, O(n): a million steps take milliseconds, where sorting them took a tenth of a second.
    """
    cut = np.partition(values, count - 1)[count - 1]
    keep = values < cut
    keep[np.flatnonzero(values == cut)[: count - int(keep.sum())]] = True
    return keep
