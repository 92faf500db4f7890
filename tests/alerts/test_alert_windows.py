"""A rule's window must hold a whole window of data: a pause longer than the window starts it afresh.

Field trial (keras-io CTC ASR example on JAX, docs/field-trial.md): after a 62 s epoch end, the next
epoch's first step waited 0.65 s for its batch (the pipeline restarting); input_wait_high fired "94% of
step time over the last 30 s" from that one step, while the run's input wait was 1.3%.
"""

from __future__ import annotations

import time

import keras
import pytest
from conftest import stalled_dataset

from rnnmon import UtilizationMonitor

BATCHES = 10  # few, so that the steps after the slow fetch do not fill a window on a loaded machine either


class SlowEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            time.sleep(1.3)  # checkpointing, a sample generation, ...: longer than the 1 s window


@pytest.mark.slow  # 1.7 s of stalls and a second epoch's pipeline restart
@pytest.mark.usefixtures("no_nvml")
def test_one_slow_fetch_after_a_long_epoch_end_is_no_alert(tmp_path, traced_model):
    def delay(batch: int) -> float:  # the next epoch's first batch: the pipeline restarts
        return 0.4 if batch == BATCHES else 0.0

    alerts = []
    monitor = UtilizationMonitor(str(tmp_path), thresholds={"input_wait_high": {"pct": 20, "for_s": 1.0}},
                                 on_alert=alerts.append)
    traced_model.fit(stalled_dataset(BATCHES, delay, prefetch="none"), epochs=2, verbose=0,
                     callbacks=[monitor, SlowEpochEnd()])
    assert [a.message for a in alerts if a.rule == "input_wait_high"] == []
