"""A fit leaves no reference cycles that hold frames, tracebacks, exceptions or iterators.

Such cycles are freed only by the cycle collector, and each one keeps a whole call stack (with its batches and
iterators) alive until then: with a test double, a gen-1 collection at the final flush took 5-24 s walking them
(issue 10). Measured by collecting with `gc.DEBUG_SAVEALL`, which keeps what the collector found in `gc.garbage`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import types

import keras
import pytest
from conftest import stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed

from rnnmon import UtilizationMonitor

pytestmark = pytest.mark.slow  # three fits and full collections: 5 s each

HEAVY = (types.FrameType, types.TracebackType, types.GeneratorType, BaseException)


class FailAt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 6:
            raise RuntimeError("stop here")


def _heavy_cycles(fit) -> list[str]:
    """Type names of frames, tracebacks, exceptions and iterators that only the cycle collector frees after `fit`."""
    gc.collect()
    gc.freeze()  # what earlier tests left is out of every collection: only what `fit` makes is walked
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fit()
        gc.collect()
        return sorted({type(o).__name__ for o in gc.garbage
                       if isinstance(o, HEAVY) or "iterator" in type(o).__name__.lower()})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()


@pytest.mark.parametrize("ending", ["finished", "failed"])
def test_a_fit_leaves_no_cycles_holding_frames_or_iterators(tmp_path, ending):
    model = tiny_model()

    def fit(monitor: bool) -> None:
        callbacks = [UtilizationMonitor(str(tmp_path / f"run{monitor}"), sample_interval_s=0.05)] if monitor else []
        callbacks += [FailAt()] if ending == "failed" else []
        with contextlib.suppress(RuntimeError):  # the failing ending
            model.fit(stalled_dataset(20, 0.005), epochs=2, verbose=0, callbacks=callbacks)

    with installed(FakeNvmlLib([FakeGpu(pids=[os.getpid()])])):
        fit(monitor=False)  # trace once, outside the measurement
        plain = _heavy_cycles(lambda: fit(monitor=False))
        monitored = _heavy_cycles(lambda: fit(monitor=True))
    assert set(monitored) <= set(plain), f"rnnmon adds cycles holding {sorted(set(monitored) - set(plain))}"
