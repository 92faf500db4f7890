"""The RNN audit per Keras backend and version: the cuDNN rule table, and its agreement with installed Keras."""

from __future__ import annotations

import importlib
import inspect

import keras
import numpy as np
import pytest
from keras import layers

from rnnmon.audit.rnn_layers import CUDNN_RULES, audit_rnn_layers, kernel_rule


def model_with(layer, masked: bool = False):
    if masked:
        inputs = keras.Input((12,), dtype="int32")
        x = layers.Embedding(50, 8, mask_zero=True, name="embed")(inputs)
    else:
        inputs = keras.Input((12, 8))
        x = inputs
    return keras.Model(inputs, layer(x))


NO_KERNEL = [
    ("jax", layers.GRU, (3, 16), "TensorFlow and torch (Keras 3.14+)"),
    ("jax", layers.LSTM, (3, 13), "TensorFlow and torch (Keras 3.10+)"),
    ("torch", layers.LSTM, (3, 9), "TensorFlow and JAX (Keras 3.14+)"),
    ("torch", layers.GRU, (3, 13), "TensorFlow run GRU"),
]


@pytest.mark.parametrize(("backend", "layer_class", "version", "others"), NO_KERNEL,
                         ids=[f"{b}-{c.__name__}-{v[0]}.{v[1]}" for b, c, v, _ in NO_KERNEL])
def test_no_kernel_on_the_backend_is_said_and_another_backend_named(backend, layer_class, version, others):
    model = model_with(layer_class(8, recurrent_dropout=0.2, name="rnn"))
    [finding] = audit_rnn_layers(model, backend=backend, keras_version=version)
    assert finding.code == "RNN_NO_FAST_KERNEL" and finding.where == "rnn"
    assert "has no cuDNN kernel on the" in finding.message and others in finding.message
    assert f"keras/src/backend/{backend}/rnn.py" in finding.message  # the code path the rule mirrors
    assert "recurrent_dropout" not in finding.message + finding.advice  # dropping it would buy nothing
    assert "KERAS_BACKEND=" in finding.advice


@pytest.mark.parametrize(("backend", "layer_class", "version"), [
    ("jax", layers.LSTM, (3, 14)), ("torch", layers.LSTM, (3, 10)), ("torch", layers.GRU, (3, 14)),
    ("tensorflow", layers.GRU, (3, 0))])
def test_default_layers_pass_where_a_kernel_exists(backend, layer_class, version):
    assert audit_rnn_layers(model_with(layer_class(8)), backend=backend, keras_version=version) == []


@pytest.mark.parametrize(("backend", "version", "expected"), [
    ("tensorflow", (3, 15), "RNN_MASK_RIGHT_PADDING"),
    ("torch", (3, 12), "RNN_MASK_RIGHT_PADDING"),
    ("torch", (3, 15), "RNN_NO_FAST_KERNEL"),
    ("jax", (3, 15), "RNN_NO_FAST_KERNEL"),
])
def test_a_mask_blocks_the_fast_path_where_the_backend_takes_none(backend, version, expected):
    [finding] = audit_rnn_layers(model_with(layers.LSTM(8, name="rnn"), masked=True), backend=backend,
                                 keras_version=version)
    assert finding.code == expected
    if expected == "RNN_NO_FAST_KERNEL":
        assert "a padding mask" in finding.message and "takes no mask" in finding.message
        assert "cuDNN kernel still runs" not in finding.message and "unmasked input" in finding.advice


@pytest.mark.slow
def test_rules_agree_with_the_installed_keras_backends():
    """The installed Keras's own code: masks never reach the JAX/torch fast path, JAX's GRU is a scan."""
    version = tuple(int(p) for p in keras.__version__.split(".")[:2])
    inputs, state = np.zeros((2, 3, 4), "float32"), np.zeros((2, 5), "float32")
    mask = np.ones((2, 3), bool)
    kernel, recurrent = np.zeros((4, 20), "float32"), np.zeros((5, 20), "float32")
    for backend in ("jax", "torch"):
        pytest.importorskip(backend)
        module = importlib.import_module(f"keras.src.backend.{backend}.rnn")
        rule = kernel_rule(backend, "LSTM", version)
        assert rule is not None and rule.kernel == (version >= {"jax": (3, 14), "torch": (3, 10)}[backend])
        if rule.mask == "none":
            with pytest.raises(NotImplementedError):
                module.lstm(inputs, state, state, mask, kernel, recurrent, None, keras.activations.tanh,
                            keras.activations.sigmoid)
    jax_gru = inspect.getsource(importlib.import_module("keras.src.backend.jax.rnn").gru)
    assert "lax.scan" in jax_gru and "cudnn" not in jax_gru.lower()
    assert not kernel_rule("jax", "GRU", version).kernel
    assert {r.backend for r in CUDNN_RULES} == {"tensorflow", "jax", "torch"}
