"""The two fixes for steps that compile again on new sequence lengths, each predicted from the run's own numbers.

A batch padded to its own longest sequence brings a new shape on most steps, and XLA (TensorFlow's
`jit_compile=True`) or JAX compiles the step once per shape. Two fixes give the batches few shapes:

- **one padded length**: every batch padded to the longest length seen (`padded_batch(n, padded_shapes=...)`):
  one compile, but every step pays for the longest sequence;
- **buckets**: `bucket_by_sequence_length(..., pad_to_bucket_boundary=True, drop_remainder=True)`: one compile per
  bucket, each step padded only to its bucket's boundary.

Each is predicted as the training time less the compiles after the warm-up and each step's cost at its length,
plus each step's cost at its padded length and, for buckets, one compile per bucket beyond the first. A step's
cost against its sequence length is fitted (least squares, `a + b * batch * length`) to the steps that compiled
nothing (rnnmon.capture.compiles.ShapeSteps; where every step compiled, to what JAX's timed compiles left of their
steps); a compile's cost is its step's time beyond that fit. What is not a step (host gaps, validation, epoch ends)
stays as it was.

Example:
    >>> fixes = compile_fixes(run.shape_steps, run.compiles, summary["time_s"], run.info.get("input_batching"))
    >>> fixes["one_length"]["training_s"], fixes["buckets"]["lengths"]
    (1.9, [24, 48, 72, 120])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

BUCKETS = 4  # buckets proposed where the pipeline does not bucket: at the quartiles of the examples' lengths
ROUND_TO = 8  # proposed boundaries are multiples of this


def compile_fixes(shape_steps: list[dict[str, Any]], compiles: list[dict[str, Any]], times: dict[str, float],
                  batching: str | None = None) -> dict[str, Any] | None:
    """{"length_dim", "lengths": [min, max] (of the batches' padded lengths), "compile_s" (a compile's mean cost),
    "one_length": {"length", "compiles", "training_s"}, "buckets": {"lengths" (each bucket's padded length),
    "compiles", "training_s"}, "batching"}; None where the shapes do not differ in a sequence length or too little
    is known to fit a step's cost."""
    steps = _by_shape(shape_steps)
    dim = _length_dim(list(steps))
    if dim is None or not compiles:
        return None
    cost = _step_cost(steps, compiles, dim)
    if cost is None:
        return None
    compile_s = _compile_cost(compiles, cost, dim)
    lengths = {shape: shape[0][dim] for shape in steps}
    counts = {shape: n for shape, (n, _, _) in steps.items()}
    # what stays: host gaps, validation, epoch ends (every step, compiles and all, is predicted anew)
    base = times["training"] - times["steps"] - times["recompiles"] - times["slow_steps"]
    longest = max(lengths.values())
    batch = max(counts, key=lambda shape: counts[shape])  # the usual batch's shape
    share = _example_share(lengths, counts, batch[0][0] or 1)
    buckets = _bucket_lengths(lengths, share)
    total = sum(counts.values())
    bucket_work = sum(total * (share(top) - share(bottom)) * cost(batch, top)
                      for bottom, top in zip([0, *buckets[:-1]], buckets))
    return {"length_dim": dim, "lengths": [min(lengths.values()), longest], "compile_s": round(compile_s, 4),
            "batching": batching,
            "one_length": {"length": longest, "compiles": 1, "training_s": _round(
                base + sum(n * cost(shape, longest) for shape, n in counts.items()))},
            "buckets": {"lengths": buckets, "compiles": len(buckets),
                        "training_s": _round(base + bucket_work + (len(buckets) - 1) * compile_s)}}


def _round(seconds: float) -> float:
    return round(max(seconds, 0.0), 3)


def _example_share(lengths: dict[tuple, int], counts: dict[tuple, int], batch: int) -> Any:
    """share(p): the fraction of examples at most `p` long. A batch padded to its longest example has the largest of
    `batch` draws: where G(p) is the fraction of batches padded to at most p, the examples' is G(p) ** (1 / batch)
    (shuffled data), so buckets are sized from the padded lengths alone."""
    padded = np.array(sorted(lengths.values()))
    steps = np.array([sum(n for shape, n in counts.items() if lengths[shape] == length) for length in padded])
    cumulative = np.cumsum(steps) / steps.sum()

    def share(p: float) -> float:
        if p <= 0:
            return 0.0
        at = int(np.searchsorted(padded, p, side="right"))
        return 1.0 if at >= len(padded) else float(cumulative[at - 1] ** (1 / batch)) if at else 0.0

    return share


def _bucket_lengths(lengths: dict[tuple, int], share: Any) -> list[int]:
    """Up to `BUCKETS` padded lengths, at the quantiles of the examples' lengths (rounded up to `ROUND_TO`), the
    last the longest seen."""
    longest = max(lengths.values())
    cuts = set()
    for q in np.linspace(0, 1, BUCKETS + 1)[1:-1]:
        reached = [length for length in sorted(set(lengths.values())) if share(length) >= q]
        if reached:
            cuts.add(min(int(math.ceil(reached[0] / ROUND_TO) * ROUND_TO), longest))
    return sorted(cuts | {longest})


def _by_shape(records: list[dict[str, Any]]) -> dict[tuple, tuple[int, int, float]]:
    """Per shape (a tuple of tuples): (steps, steps that compiled nothing, their seconds), over every chunk."""
    totals: dict[tuple, list[float]] = {}
    for record in records:
        shapes = record.get("shapes") or []
        if not shapes or shapes[0] is None or len(shapes[0]) < 2:
            continue
        key = tuple(None if shape is None else tuple(shape) for shape in shapes)
        entry = totals.setdefault(key, [0, 0, 0.0])
        entry[0] += record["steps"]
        entry[1] += record["plain_steps"]
        entry[2] += record["plain_s"]
    return {key: (int(n), int(plain), float(seconds)) for key, (n, plain, seconds) in totals.items()}


def _length_dim(shapes: list[tuple]) -> int | None:
    """The sequence-length dimension of the first array: the one after the batch that differs most across shapes."""
    firsts = [shape[0] for shape in shapes if shape[0] is not None]
    if len({len(first) for first in firsts}) != 1 or len(firsts) < 2:
        return None
    spread = [len({first[d] for first in firsts}) for d in range(1, len(firsts[0]))]
    best = int(np.argmax(spread)) + 1 if spread else None
    return best if best is not None and spread[best - 1] > 1 and all(f[best] for f in firsts) else None


def _step_cost(steps: dict[tuple, tuple[int, int, float]], compiles: list[dict[str, Any]], dim: int) -> Any:
    """seconds(shape, length) of one step at `length`, fitted as a + b * batch * length; None without data."""
    points = [(_work(shape, shape[0][dim]), seconds / plain, plain) for shape, (_, plain, seconds) in steps.items()
              if plain > 0]
    if not points:  # every step compiled: where JAX timed a compile, the rest of its step stands in (more than
        for record in compiles:  # the compute: the dispatch around the compile goes with it)
            length = _length_of(record, dim)
            if record.get("seconds") is not None and length:
                compute = record["duration_s"] - record["seconds"]
                if compute > 0:
                    points.append((_work(record["shapes"], length), compute / max(record.get("batches") or 1, 1), 1))
    if not points:
        return None
    x, y, w = (np.array(column, dtype=float) for column in zip(*points))
    if len(set(x.tolist())) < 2:
        a, b = 0.0, float(np.average(y / x, weights=w))  # one length seen: cost in proportion to the work
    else:
        b, a = np.polyfit(x, y, 1, w=np.sqrt(w))
        if b < 0:  # noise: a longer sequence never costs less
            a, b = float(np.average(y, weights=w)), 0.0
    return lambda shape, length: max(float(a + b * _work(shape, length)), 0.0)


def _work(shape: tuple | list, length: int) -> float:
    """A step's work at `length`: batch size x sequence length (the other sizes are the same on every step)."""
    return float(shape[0][0] or 1) * float(length)


def _compile_cost(compiles: list[dict[str, Any]], cost: Any, dim: int) -> float:
    """A compile's mean cost to the fit: its step's time beyond the fitted cost of a step at its length (on JAX
    more than the compile events' seconds: the dispatch around them goes with them); the measured seconds where
    the step's length is unknown."""
    costs = []
    for record in compiles:
        length = _length_of(record, dim)
        if length:
            excess = record["duration_s"] - max(record.get("batches") or 1, 1) * cost(record["shapes"], length)
            costs.append(max(excess, 0.0) / max(record["count"], 1))
        elif record.get("seconds") is not None:
            costs.append(record["seconds"] / max(record["count"], 1))
    return float(np.mean(costs)) if costs else 0.0


def _length_of(record: dict[str, Any], dim: int) -> int | None:
    """The sequence length of a compile record's first array, where its shapes say it."""
    shapes = record.get("shapes")
    first = shapes[0] if shapes else None
    return first[dim] if first and len(first) > dim and first[dim] else None
