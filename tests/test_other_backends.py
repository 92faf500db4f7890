"""The callback on Keras's torch backend: steps, phases and the report work; input wait is honestly NA."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import read_run

from rnnmon.analysis import summarize

SCRIPT = textwrap.dedent("""
    import numpy as np, keras, rnnmon
    x = np.random.default_rng(0).normal(size=(32 * 30, 16, 8)).astype("float32")
    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, x[:, :, :1].mean(axis=1), batch_size=32, epochs=2, verbose=0, validation_split=0.2,
              callbacks=[rnnmon.UtilizationMonitor({logdir!r})])
""")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_backend(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(logdir=str(tmp_path))], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    run = read_run(str(tmp_path))
    summary = summarize(run)
    assert summary["backend"] == "torch" and summary["steps"] == 48 and summary["status"] == "finished"
    assert summary["input_wait_ms"] is None and summary["input_wait_measured"] == "not measured: the torch backend"
    assert summary["eval_fraction"] > 0 and summary["verdict"] in {"compute-bound", "host-bound"}
