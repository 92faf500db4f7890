"""The public audit(): RNN and input findings together, most severe first, without training."""

import keras
import numpy as np
import tensorflow as tf

from rnnmon import audit


def lstm_model(**lstm_kwargs):
    inputs = keras.Input((5, 3))
    return keras.Model(inputs, keras.layers.LSTM(8, name="lstm", **lstm_kwargs)(inputs))


def test_model_and_pipeline_findings_sorted_by_severity():
    dataset = tf.data.Dataset.from_tensor_slices(np.zeros((32, 5, 3), "float32")).batch(8)
    findings = audit(lstm_model(recurrent_dropout=0.2), dataset)

    assert [(f.severity, f.code) for f in findings] == [
        ("warning", "RNN_NO_FAST_KERNEL"),
        ("warning", "SMALL_BATCH"),
        ("info", "PIPELINE_NO_PREFETCH"),
    ]


def test_batch_size_without_a_dataset():
    assert [f.code for f in audit(lstm_model(), batch_size=16)] == ["SMALL_BATCH"]


def test_clean_model_and_pipeline():
    dataset = tf.data.Dataset.from_tensor_slices(np.zeros((64, 5, 3), "float32")).batch(64).prefetch(1)
    assert audit(lstm_model(), dataset) == []
    assert audit(lstm_model()) == []
