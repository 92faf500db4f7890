"""The callback audits the model as fit builds it: masks of a Sequential without Input, in-model preprocessing."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import read_run, sequences

import rnnmon
from rnnmon import UtilizationMonitor


@pytest.mark.slow  # a model built at fit traces afresh (1.0-1.6 s); the two audits below stay in the fast loop
@pytest.mark.usefixtures("no_nvml")
def test_sequential_without_input_gets_the_mask_finding(tmp_path):
    import keras

    model = keras.Sequential([keras.layers.Masking(0.0), keras.layers.LSTM(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x, y = sequences(2)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
    codes = [f["code"] for f in read_run(str(tmp_path)).findings]
    assert "RNN_MASK_RIGHT_PADDING" in codes, codes


def _text_model():
    import keras

    inputs = keras.Input((1,), dtype="string")
    vectorize = keras.layers.TextVectorization(max_tokens=50, output_sequence_length=6, name="vectorize")
    vectorize.adapt(np.array([["a b c"], ["b c d e"]]))
    hidden = keras.layers.LSTM(4)(keras.layers.Embedding(50, 4)(vectorize(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="adam", loss="mse")
    return model


def test_text_vectorization_inside_the_model_is_flagged():
    [finding] = [f for f in rnnmon.audit(_text_model()) if f.code == "PREPROCESSING_IN_MODEL"]
    assert finding.where == "vectorize" and "TextVectorization" in finding.message
    assert "ds.map(lambda x, y: (vectorize(x), y)" in finding.advice


def test_a_model_without_preprocessing_layers_is_not_flagged():
    from conftest import tiny_model

    assert not [f for f in rnnmon.audit(tiny_model()) if f.code == "PREPROCESSING_IN_MODEL"]


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_one_monitor_logs_findings_once_over_several_fits(tmp_path, rnnmon_warnings):
    import keras

    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(4, recurrent_dropout=0.1),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    monitor = UtilizationMonitor(str(tmp_path))
    x, y = sequences(1)
    for _ in range(3):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor])
    warnings = rnnmon_warnings()
    assert sum("CPU-only" in w for w in warnings) <= 1, warnings  # once per process (tests/capture/test_tuner.py)
    assert sum("RNN_NO_FAST_KERNEL" in w for w in warnings) == 1, warnings
    assert [f["code"] for f in read_run(str(tmp_path)).findings] == ["RNN_NO_FAST_KERNEL"]  # still recorded
