"""The callback on Keras's JAX and torch backends: steps, phases, input wait and the report."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import read_run

from rnnmon.analysis.summary import summarize

pytestmark = pytest.mark.slow  # a fit in a JAX or torch process: 6-15 s each

SCRIPT = textwrap.dedent("""
    import time
    import numpy as np, keras, rnnmon

    def batches():
        rng = np.random.default_rng(0)
        while True:
            time.sleep(0.01)  # a slow Python input pipeline
            x = rng.normal(size=(32, 16, 8)).astype("float32")
            yield x, x[:, :, :1].mean(axis=1)

    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(batches(), steps_per_epoch=24, epochs=2, verbose=0, validation_data=batches(), validation_steps=4,
              callbacks=[rnnmon.UtilizationMonitor({logdir!r})])
""")


def _fit(tmp_path, backend: str) -> dict:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    env = {**os.environ, "KERAS_BACKEND": backend}
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(logdir=str(tmp_path))], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = summarize(read_run(str(tmp_path)))
    assert summary["backend"] == backend and summary["steps"] == 48 and summary["status"] == "finished"
    assert summary["eval_fraction"] > 0
    return summary


def test_jax_backend_times_the_input_wait(tmp_path):
    summary = _fit(tmp_path, "jax")
    assert summary["input_wait_measured"] == "measured"
    assert 8.0 < summary["input_wait_ms"]["median"] < 20.0  # the generator's 10 ms
    assert summary["verdict"] == "input-bound"
    # Advice for a generator read on JAX: in the training loop, not on a tf.data thread; a PyDataset fixes it.
    findings = {f["code"]: f for f in summary["findings"]}
    assert "in the training loop itself" in findings["DATA_NOT_TF"]["message"]
    assert "from_generator" not in findings["DATA_NOT_TF"]["message"]
    assert summary["input_kind"] == "generator" and "keras.utils.PyDataset" in findings["INPUT_BOUND"]["advice"]
    [bound] = [f for f in summary["findings"] if f["code"] == "INPUT_BOUND"]  # one prediction, one quantity:
    assert bound["speedup"] == summary["input_speedup"] > 1.2  # (they used to disagree on JAX)


def test_torch_backend_times_the_input_wait(tmp_path):
    summary = _fit(tmp_path, "torch")
    assert summary["input_wait_measured"] == "measured"
    assert 8.0 < summary["input_wait_ms"]["median"] < 30.0  # the generator's 10 ms, fetched before the hook
    assert summary["shares"]["host"] < 0.15  # the wait is no longer counted as host gap
    # No verdict asserted: Keras's torch LSTM step takes 10-300 ms on this shared 2-core machine.
    [finding] = [f for f in summary["findings"] if f["code"] == "DATA_NOT_TF"]
    assert "in the training loop itself" in finding["message"] and "DataLoader` with `num_workers" in finding["advice"]


LOADER_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np, torch, keras, rnnmon
    from torch.utils.data import DataLoader, TensorDataset

    def slow_collate(items):  # 20 ms of Python per batch, as a decoding collate_fn takes
        time.sleep(0.02)
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    x = np.random.default_rng(0).normal(size=(32 * 24, 16, 8)).astype("float32")
    samples = TensorDataset(torch.from_numpy(x), torch.from_numpy(x[:, :, :1].mean(axis=1)))
    thresholds = {"input_wait_high": {"for_s": 0.3}}
    for name, workers in (("no-workers", {}), ("workers", {"num_workers": 2, "persistent_workers": True})):
        loader = DataLoader(samples, batch_size=32, collate_fn=slow_collate, **workers)
        model = keras.Sequential([keras.Input((16, 8)), keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(loader, epochs=2, verbose=0,
                  callbacks=[rnnmon.UtilizationMonitor(sys.argv[1] + "/" + name, thresholds=thresholds)])
""")


def test_torch_dataloader_gets_dataloader_advice_and_num_workers_0_is_flagged(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    result = subprocess.run([sys.executable, "-c", LOADER_SCRIPT, str(tmp_path)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    serial = summarize(read_run(str(tmp_path / "no-workers")))
    findings = {f["code"]: f for f in serial["findings"]}
    assert serial["verdict"] == "input-bound" and "DATALOADER_NO_WORKERS" in findings, serial["findings"]
    flagged = findings["DATALOADER_NO_WORKERS"]
    assert flagged["severity"] == "warning" and "collate_fn=slow_collate, defined at <string>:" in flagged["message"]
    # The advice, the finding's and the alert's, is a DataLoader's: its knobs, not tf.data's.
    alerts = [a["message"] for a in read_run(str(tmp_path / "no-workers")).alerts
              if a["rule"] == "input_wait_high" and a["state"] == "firing"]
    assert alerts
    for advice in (findings["INPUT_BOUND"]["advice"], alerts[0]):
        assert all(knob in advice for knob in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor"))
        assert "tf.data" not in advice and "num_parallel_calls" not in advice
    assert serial["input_kind"] == "DataLoader"
    # With workers the loader is not flagged, and each step waits less for its batch.
    parallel = summarize(read_run(str(tmp_path / "workers")))
    assert "DATALOADER_NO_WORKERS" not in {f["code"] for f in parallel["findings"]}
    assert parallel["input_wait_ms"]["median"] < 0.75 * serial["input_wait_ms"]["median"]
