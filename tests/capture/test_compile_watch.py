"""The compile signal of each framework, read as the monitor reads it at a step's end (real fits on ragged
lengths: tests/capture/test_ragged_lengths.py)."""

from __future__ import annotations

import math
import time

import pytest

from rnnmon.capture.compiles import CompileWatch


def test_jax_compile_events_are_counted_and_timed_inside_the_step_they_happen_in():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    watch = CompileWatch.for_model(None, "jax")
    try:
        step = jax.jit(lambda x: jnp.tanh(x).sum())
        batches = [jnp.ones((4, length)) for length in (7, 7, 9)]  # made (and compiled) outside the steps
        timings = []
        for batch in batches:  # a new length compiles, a length seen does not
            begin = time.perf_counter()
            step(batch).block_until_ready()
            timings.append(watch.take(begin, time.perf_counter(), new_shapes=False))
        jax.jit(lambda x: x * 2)(batches[0])  # a compile between steps belongs to no step
        between = watch.take(time.perf_counter(), time.perf_counter(), new_shapes=False)
    finally:
        watch.close()
    (first, _), (again, again_s), (longer, longer_s) = timings
    assert (first, again, longer) == (1, 0, 1) and math.isnan(again_s)
    assert 0 < longer_s < 10 and watch.source == "jax"
    assert between[0] == 0
    jax.jit(lambda x: x * 3)(batches[0])  # closed: no longer fed
    assert watch._events == []


def test_a_backend_without_a_signal_compiles_nothing():
    watch = CompileWatch.for_model(object(), "torch")  # eager torch (no jit_compile): any shape as it comes
    assert watch.source == "" and watch.take(0.0, 1.0, new_shapes=True)[0] == 0
