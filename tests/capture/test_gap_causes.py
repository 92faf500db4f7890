"""Idle gaps and idle_gap alerts name the recorded phase they overlapped: warm-up and epoch ends are causes.

Field trial (issue 26): the GPU idling until the first step had compiled was booked as an idle gap caused by
"input", and a fit with no validation at all was told that 38.1 s was "mostly during validation. Validate less
often" (its epoch ends counted as validation).
"""

from __future__ import annotations

import os
import time

import keras
import pytest
from conftest import read_run, sequences, stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed
from idle_windows import IdleWindows

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize


class _IdleUntilFirstStep(keras.callbacks.Callback):
    """The fake GPU idles from before `fit` until the first step has ended, as a GPU does while the step compiles."""

    def __init__(self, windows: IdleWindows) -> None:
        super().__init__()
        self.windows = windows

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self.windows.close()


class _SlowEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            time.sleep(0.6)  # a checkpoint written at the epoch's end


@pytest.mark.slow
def test_gpu_idle_until_the_first_step_is_warmup_not_input(tmp_path):
    """The first batch takes 0.6 s to read (a pipeline filling its buffers), then the first step compiles: the
    first step's input wait was the only cause the gap overlapped, and the gap was booked as "input"."""
    windows = IdleWindows()
    with installed(FakeNvmlLib([FakeGpu(utilization=windows.utilization, pids=[os.getpid()])])):
        model = tiny_model(device_s=0.01)
        windows.open()
        model.fit(stalled_dataset(40, lambda batch: 0.6 if batch == 0 else 0.0), epochs=1, verbose=0,
                  callbacks=[_IdleUntilFirstStep(windows), UtilizationMonitor(str(tmp_path), sample_interval_s=0.1,
                                                                              audit=False)])
    summary = summarize(read_run(str(tmp_path)))
    ((_, idle_end),) = windows.windows
    first = min(summary["idle_gaps"], key=lambda gap: gap["start"])
    assert first["cause"] == "warmup", summary["idle_gaps"]
    assert first["end"] == pytest.approx(idle_end, abs=0.35)
    assert summary["idle_by_cause_s"]["input"] == 0.0, summary["idle_by_cause_s"]


@pytest.mark.usefixtures("no_nvml")
def test_idle_gap_at_an_epoch_end_without_validation_names_the_epoch_end(tmp_path, traced_model):
    alerts = []
    x, y = sequences(8)
    monitor = UtilizationMonitor(str(tmp_path), audit=False, flush_secs=0.5, thresholds={"idle_gap": {"min_s": 0.5}},
                                 on_alert=alerts.append)
    traced_model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[_SlowEpochEnd(), monitor])
    fired = [alert.message for alert in alerts if alert.rule == "idle_gap" and alert.state == "firing"]
    assert len(fired) == 1, [alert.message for alert in alerts]
    assert "mostly at epoch ends" in fired[0] and "validation" not in fired[0].lower(), fired[0]
    assert "`.repeat()`" in fired[0] and "`steps_per_epoch`" in fired[0], fired[0]  # one iterator, no teardown
    summary = summarize(read_run(str(tmp_path)))
    assert summary["idle_by_cause_s"]["epoch_end"] >= 0.6 and summary["idle_by_cause_s"]["eval"] == 0.0
