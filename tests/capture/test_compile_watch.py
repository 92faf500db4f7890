"""The compile signal of each framework, read as the monitor reads it at a step's end (real fits on ragged
lengths: tests/capture/test_ragged_lengths.py). JAX runs in a process of its own: imported here, it would warn at
every later fork of the test process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from rnnmon.capture.compiles import CompileWatch

JAX_STEPS = textwrap.dedent("""
    import json, math, time
    import jax, jax.numpy as jnp
    from rnnmon.capture.compiles import CompileWatch

    watch = CompileWatch.for_model(None, "jax")
    step = jax.jit(lambda x: jnp.tanh(x).sum())
    batches = [jnp.ones((4, length)) for length in (7, 7, 9)]  # made (and compiled) outside the steps
    timings = []
    for batch in batches:  # a new length compiles, a length seen does not
        begin = time.perf_counter()
        step(batch).block_until_ready()
        timings.append(watch.take(begin, time.perf_counter(), shapes=None))
    jax.jit(lambda x: x * 2)(batches[0])  # a compile between steps belongs to no step
    now = time.perf_counter()
    between = watch.take(now, now, shapes=None)
    watch.close()
    jax.jit(lambda x: x * 3)(batches[0])  # closed: no longer fed
    print(json.dumps({"counts": [count for count, _ in timings], "seconds": [None if math.isnan(s) else s
                      for _, s in timings], "between": between[0], "left": len(watch._events),
                      "source": watch.source}))
""")


@pytest.mark.slow  # JAX in a process of its own (2.2 s of CPU)
def test_jax_compile_events_are_counted_and_timed_inside_the_step_they_happen_in():
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    result = subprocess.run([sys.executable, "-c", JAX_STEPS], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["counts"] == [1, 0, 1] and seen["seconds"][1] is None, seen
    assert 0 < seen["seconds"][2] < 10 and seen["source"] == "jax"
    assert seen["between"] == 0 and seen["left"] == 0


def test_a_backend_without_a_signal_compiles_nothing():
    watch = CompileWatch.for_model(object(), "torch")  # eager torch (no jit_compile): any shape as it comes
    assert watch.source == "" and watch.take(0.0, 1.0, shapes=((2, 3),))[0] == 0
