"""The input-wait wrapper must not change what it measures: the partial last batch traces nothing new."""

from __future__ import annotations

import pytest
from conftest import BATCH, FEATURES, TIMESTEPS, read_run, sequences

from rnnmon import UtilizationMonitor

EPOCHS = 3


def _counting_model():
    """A tiny LSTM whose `traces` counts how often TensorFlow traced its train step (Python runs only then)."""
    import keras

    class CountingModel(keras.Sequential):
        traces = 0

        def train_step(self, data):
            self.traces += 1
            return super().train_step(data)

    keras.utils.set_random_seed(0)
    model = CountingModel([keras.Input((TIMESTEPS, FEATURES)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def _partial_dataset():
    import tensorflow as tf

    x, y = sequences(6)
    return tf.data.Dataset.from_tensor_slices((x[:-5], y[:-5])).batch(BATCH)  # 5 batches of 32, one of 27


@pytest.mark.slow  # two fresh traces and two retraces (2.6-3.9 s of CPU): nothing cheaper can check a trace count
@pytest.mark.usefixtures("no_nvml")
def test_partial_last_batch_traces_no_more_than_without_the_monitor(tmp_path):
    plain, monitored = _counting_model(), _counting_model()
    plain.fit(_partial_dataset(), epochs=EPOCHS, verbose=0)
    monitored.fit(_partial_dataset(), epochs=EPOCHS, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
    assert monitored.traces == plain.traces, (monitored.traces, plain.traces)
    run = read_run(str(tmp_path))
    assert run.info["input_wait"] == "measured"
    partial = run.steps[run.steps[:, 0] % 6 == 0]  # each epoch's 6th step is its 27-sequence batch
    assert len(partial) == EPOCHS  # (a retrace would show in `traces`, which counts every one: not in step time)
