"""RNN fast-path audit: its rules against Keras's own cuDNN dispatch, then where it looks and what it says."""

import importlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

from rnnmon.audit.rnn_layers import audit_rnn_layers

# Test only: Keras's TF dispatch internals (the package attribute `rnn` is a function, hence import_module).
keras_tf_rnn = importlib.import_module("keras.src.backend.tensorflow.rnn")


class _ReachedCudnn(Exception):
    pass


@pytest.fixture
def cudnn_probe(monkeypatch):
    """Keras's dispatch as on a GPU: the availability check says yes, the cuDNN call itself stops the run.

    On CPU `use_cudnn=True` raises ValueError for every configuration (`cudnn_ok` also requires a GPU),
    so only with this probe does Keras's own decision (inner_loop's use_cudnn and recurrent_dropout checks,
    then `cudnn_ok`'s argument checks) become visible.
    """

    def reached(*args, **kwargs):
        raise _ReachedCudnn

    monkeypatch.setattr(keras_tf_rnn, "_is_gpu_available", lambda: True)
    monkeypatch.setattr(keras_tf_rnn, "_cudnn_lstm", reached)
    monkeypatch.setattr(keras_tf_rnn, "_cudnn_gru", reached)


def keras_dispatch(layer, mask=None):
    """'cudnn' if Keras calls the cuDNN kernel, 'refused' if it raises for use_cudnn=True, else 'generic'."""
    try:
        layer(np.zeros((2, 3, 4), "float32"), mask=mask, training=True)
    except _ReachedCudnn:
        return "cudnn"
    except ValueError as error:
        if "cuDNN is not supported for this layer configuration" in str(error):
            return "refused"
        raise
    return "generic"


def reasons(finding):
    """The arguments a RNN_NO_FAST_KERNEL message lists, e.g. ['recurrent_dropout=0.2', 'unroll=True']."""
    listed = finding.message.split("cannot use the cuDNN kernel: ")[1].split(". Keras runs")[0]
    return [reason.split(" (")[0] for reason in listed.split("; ")]


def tanh_lambda(x):
    return keras.ops.tanh(x)


# (kwargs, the reasons the audit must list); both LSTM and GRU.
CONFIGS = {
    "default": ({}, []),
    "input dropout": ({"dropout": 0.3}, []),
    "go_backwards": ({"go_backwards": True}, []),
    "stateful": ({"stateful": True}, []),
    "activation 'tanh'": ({"activation": "tanh"}, []),
    "activation keras.ops.tanh": ({"activation": keras.ops.tanh}, []),
    "activation tf.tanh": ({"activation": tf.tanh}, []),
    "recurrent_activation keras.ops.sigmoid": ({"recurrent_activation": keras.ops.sigmoid}, []),
    "recurrent_activation tf.sigmoid": ({"recurrent_activation": tf.sigmoid}, []),
    "recurrent_dropout": ({"recurrent_dropout": 0.2}, ["recurrent_dropout=0.2"]),
    "activation relu": ({"activation": "relu"}, ["activation='relu'"]),
    "activation computing tanh": ({"activation": tanh_lambda}, ["activation='tanh_lambda'"]),
    "activation lambda": ({"activation": lambda x: keras.ops.tanh(x)}, ["activation=<lambda>"]),
    "recurrent_activation hard_sigmoid": (
        {"recurrent_activation": "hard_sigmoid"},
        ["recurrent_activation='hard_sigmoid'"],
    ),
    "unroll": ({"unroll": True}, ["unroll=True"]),
    "no bias": ({"use_bias": False}, ["use_bias=False"]),
    "use_cudnn=False": ({"use_cudnn": False}, ["use_cudnn=False"]),
    "several": (
        {"recurrent_dropout": 0.1, "unroll": True, "activation": "relu"},
        ["unroll=True", "recurrent_dropout=0.1", "activation='relu'"],
    ),
}
CASES = [
    pytest.param(layer_class, kwargs, expected, id=f"{layer_class.__name__}-{name}")
    for layer_class in (layers.LSTM, layers.GRU)
    for name, (kwargs, expected) in CONFIGS.items()
] + [pytest.param(layers.GRU, {"reset_after": False}, ["reset_after=False"], id="GRU-reset_after=False")]


@pytest.mark.parametrize(("layer_class", "kwargs", "expected"), CASES)
def test_rules_agree_with_keras_dispatch(cudnn_probe, layer_class, kwargs, expected):
    layer = layer_class(4, **{"use_cudnn": True, **kwargs})
    findings = audit_rnn_layers(keras.Sequential([layer]))

    assert [reasons(f) for f in findings] == ([expected] if expected else [])
    if kwargs.get("use_cudnn") is False:
        assert keras_dispatch(layer) == "generic"
    else:
        assert keras_dispatch(layer) == ("refused" if expected else "cudnn")


@pytest.mark.parametrize("cell_class", [layers.LSTMCell, layers.GRUCell])
def test_generic_rnn_wrapper_never_reaches_cudnn(cudnn_probe, cell_class):
    layer = layers.RNN(cell_class(4))
    [finding] = audit_rnn_layers(keras.Sequential([layer]))

    assert keras_dispatch(layer) == "generic"
    assert finding.code == "RNN_NO_FAST_KERNEL"
    kind = cell_class.__name__.removesuffix("Cell")
    assert finding.advice == f"`layers.RNN(layers.{cell_class.__name__}(4))` → `layers.{kind}(4)`"


@pytest.mark.parametrize("layer_class", [layers.LSTM, layers.GRU])
def test_right_padded_mask_still_reaches_cudnn(cudnn_probe, layer_class):
    mask = np.array([[True, True, False], [True, False, False]])
    assert keras_dispatch(layer_class(4, use_cudnn=True), mask=mask) == "cudnn"


def sequence_model(*blocks, steps=5, features=3):
    inputs = keras.Input((steps, features))
    x = inputs
    for block in blocks:
        x = block(x)
    return keras.Model(inputs, x)


def test_default_layers_are_not_flagged():
    model = sequence_model(layers.LSTM(8, return_sequences=True), layers.GRU(8), layers.Dense(1))
    assert audit_rnn_layers(model) == []


def test_finding_names_the_layer_and_the_change():
    model = sequence_model(layers.LSTM(64, recurrent_dropout=0.2, name="encoder"))
    [finding] = audit_rnn_layers(model)

    assert (finding.code, finding.severity, finding.where) == ("RNN_NO_FAST_KERNEL", "warning", "encoder")
    assert "'encoder' (LSTM)" in finding.message
    assert finding.advice == "`layers.LSTM(64, recurrent_dropout=0.2)` → `layers.LSTM(64, dropout=0.2)`"


def test_bidirectional_halves_are_checked_separately():
    backward = layers.LSTM(8, go_backwards=True, recurrent_dropout=0.2, name="backward_slow")
    model = sequence_model(layers.Bidirectional(layers.LSTM(8), backward_layer=backward, name="bi"))
    assert [f.where for f in audit_rnn_layers(model)] == ["bi/backward_slow"]


def test_bidirectional_reports_both_halves():
    model = sequence_model(layers.Bidirectional(layers.GRU(8, unroll=True, name="gru"), name="bi"))
    assert [f.where for f in audit_rnn_layers(model)] == ["bi/forward_gru", "bi/backward_gru"]


class Encoder(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rnn = layers.GRU(4, reset_after=False, name="gru")

    def call(self, x):
        return self.rnn(x)


@pytest.mark.parametrize(
    ("block", "where"),
    [
        (keras.Sequential([layers.LSTM(4, unroll=True, name="lstm")], name="inner"), "inner/lstm"),
        (layers.TimeDistributed(layers.LSTM(4, use_bias=False, name="lstm"), name="td"), "td/lstm"),
        (Encoder(name="encoder"), "encoder/gru"),
        (layers.RNN(layers.LSTMCell(4), name="rnn"), "rnn"),
    ],
    ids=["nested-sequential", "time-distributed", "custom-layer", "rnn-wrapper"],
)
def test_nested_layers_are_found_with_their_path(block, where):
    steps_shape = (2, 5, 3) if isinstance(block, layers.TimeDistributed) else (5, 3)
    inputs = keras.Input(steps_shape)
    model = keras.Model(inputs, block(inputs))
    assert [(f.code, f.where) for f in audit_rnn_layers(model)] == [("RNN_NO_FAST_KERNEL", where)]


def test_stacked_cells_get_one_layer_each():
    cells = [layers.LSTMCell(4), layers.GRUCell(3, use_bias=False, name="gru_cell")]
    model = sequence_model(layers.RNN(cells))
    [finding] = audit_rnn_layers(model)

    assert reasons(finding)[1:] == ["gru_cell.use_bias=False"]
    assert "`layers.LSTM(4, return_sequences=True)`, `layers.GRU(3)`" in finding.advice


def embedded_lstm(mask_zero, *blocks):
    inputs = keras.Input((5,), dtype="int32")
    x = layers.Embedding(20, 3, mask_zero=mask_zero, name="embedding")(inputs)
    for block in blocks:
        x = block(x)
    return keras.Model(inputs, layers.LSTM(4, name="lstm")(x))


@pytest.mark.parametrize(
    ("mask_zero", "block", "source"),
    [
        (True, layers.Dense(3), "'embedding' (Embedding(mask_zero=True))"),
        (False, layers.Masking(), "(Masking)"),
    ],
    ids=["embedding-mask-zero", "masking-layer"],
)
def test_masked_input_is_an_info_note_not_a_missed_kernel(mask_zero, block, source):
    [finding] = audit_rnn_layers(embedded_lstm(mask_zero, block))

    assert (finding.code, finding.severity, finding.where) == ("RNN_MASK_RIGHT_PADDING", "info", "lstm")
    assert source in finding.message and "right-padded" in finding.message
    assert "padding='post'" in finding.advice


def test_mask_reaches_bidirectional_halves():
    inputs = keras.Input((5,), dtype="int32")
    x = layers.Embedding(20, 3, mask_zero=True)(inputs)
    model = keras.Model(inputs, layers.Bidirectional(layers.GRU(4, name="gru"), name="bi")(x))
    assert [(f.code, f.where) for f in audit_rnn_layers(model)] == [
        ("RNN_MASK_RIGHT_PADDING", "bi/forward_gru"),
        ("RNN_MASK_RIGHT_PADDING", "bi/backward_gru"),
    ]


def test_no_mask_note_without_a_mask_or_once_it_is_dropped():
    assert audit_rnn_layers(embedded_lstm(False)) == []
    with pytest.warns(UserWarning, match="destroy the mask"):
        dropped = embedded_lstm(True, layers.Conv1D(3, 2, padding="same"))
    assert audit_rnn_layers(dropped) == []
