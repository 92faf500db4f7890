"""The two fixes for steps that compile per sequence length, predicted from a run's records: a step's cost against
its length, a compile's cost, and the examples' lengths behind batches padded to their longest (real fits and
the fixes run side by side: tests/capture/test_ragged_lengths.py, benchmarks/ragged_lengths.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rnnmon.analysis.compile_advice import compile_fixes

BATCH = 16
A, B = 0.002, 1e-5  # a step costs A + B * batch * length seconds
COMPILE_S = 0.8


def _step_s(length: int) -> float:
    return A + B * BATCH * length


def _records(padded: list[int]) -> tuple[list[dict], list[dict], dict]:
    """The records of a fit whose batches were padded to `padded`, each length compiling at its first step."""
    shape_steps, compiles, seen = [], [], set()
    for step, length in enumerate(padded, 1):
        new = length not in seen
        seen.add(length)
        shapes = [[BATCH, length], [BATCH]]
        shape_steps.append({"shapes": shapes, "steps": 1, "plain_steps": 0 if new else 1,
                            "plain_s": 0.0 if new else _step_s(length)})
        if new and step > 1:  # the first is the warm-up's
            compiles.append({"step": step, "batches": 1, "time": float(step), "duration_s": COMPILE_S + _step_s(length),
                             "count": 1, "seconds": None, "source": "xla", "shapes": shapes})
    recompiles, steps = COMPILE_S * len(compiles), sum(_step_s(length) for length in padded[1:])
    return shape_steps, compiles, {"training": steps + recompiles + 0.5, "steps": steps, "recompiles": recompiles,
                                   "slow_steps": 0.0}  # and 0.5 s of epoch ends, which no fix changes


def test_one_length_is_every_step_at_the_longest_and_one_compile():
    padded = [40, 12, 12, 25, 12, 40, 25, 12, 31, 12] * 3
    fixes = compile_fixes(*_records(padded))
    assert fixes["length_dim"] == 1 and fixes["lengths"] == [12, 40]
    assert fixes["compile_s"] == pytest.approx(COMPILE_S, rel=1e-3)
    assert fixes["one_length"]["length"] == 40 and fixes["one_length"]["compiles"] == 1
    # the training time keeps what is not steps or compiles: the steps after the warm-up at 40, and epoch ends
    assert fixes["one_length"]["training_s"] == pytest.approx((len(padded) - 1) * _step_s(40) + 0.5, rel=0.05)


def test_buckets_pay_one_compile_each_and_the_examples_lengths_not_the_batches():
    rng = np.random.default_rng(0)
    examples = np.clip(rng.lognormal(2.6, 0.7, size=BATCH * 400), 2, 120).astype(int)
    padded = [int(batch.max()) for batch in examples.reshape(-1, BATCH)]
    fixes = compile_fixes(*_records(padded))
    lengths = fixes["buckets"]["lengths"]
    assert 2 <= len(lengths) <= 4 and lengths[-1] == max(padded) and lengths == sorted(lengths)
    assert fixes["buckets"]["compiles"] == len(lengths)
    # what the buckets really cost: each example's batch padded to its bucket's length
    share = np.array([np.mean(examples <= length) for length in lengths])
    true_steps = len(padded) * np.diff(np.r_[0.0, share])
    true_s = float(sum(n * _step_s(length) for n, length in zip(true_steps, lengths)))
    true_s += (len(lengths) - 1) * COMPILE_S + 0.5
    assert fixes["buckets"]["training_s"] == pytest.approx(true_s, rel=0.15), (fixes, true_s)
    assert fixes["buckets"]["training_s"] < fixes["one_length"]["training_s"]


def test_shapes_that_differ_only_in_batch_size_are_no_length_fix():
    shape_steps = [{"shapes": [[32, 16, 8], [32, 1]], "steps": 12, "plain_steps": 11, "plain_s": 0.02},
                   {"shapes": [[5, 16, 8], [5, 1]], "steps": 1, "plain_steps": 0, "plain_s": 0.0}]
    compiles = [{"step": 13, "batches": 1, "time": 13.0, "duration_s": 0.9, "count": 1, "seconds": None,
                 "source": "xla", "shapes": [[5, 16, 8], [5, 1]]}]
    times = {"training": 1.0, "steps": 0.1, "recompiles": 0.9, "slow_steps": 0.0}
    assert compile_fixes(shape_steps, compiles, times) is None
