"""HOST_BOUND names the callback whose batch hooks take the host time, with its ms per step."""

from __future__ import annotations

import time

import pytest
from conftest import BATCH, read_run, sequences, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize


def _slow_callback():
    import keras

    class SlowAfterEachStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.004)

    return SlowAfterEachStep()


@pytest.mark.usefixtures("no_nvml")
def test_host_bound_names_the_slow_callback_and_its_cost(tmp_path):
    import tensorflow as tf

    x, y = sequences(30)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(2)
    slow = _slow_callback()
    tiny_model().fit(dataset, epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path)), slow])
    summary = summarize(read_run(str(tmp_path)))
    [finding] = [f for f in summary["findings"] if f["code"] == "HOST_BOUND"]
    assert "The batch hooks of SlowAfterEachStep take" in finding["message"], finding["message"]
    assert summary["callback_ms_per_step"]["SlowAfterEachStep"] > 3.5  # a 4 ms sleep (longer on a busy host)
    assert finding["speedup"] > 1
    assert "on_train_batch_end" not in vars(slow)  # the timing is removed after the fit
