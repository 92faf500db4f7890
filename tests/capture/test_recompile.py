"""A partial last batch on every backend: the step that compiled again is named with its shapes, and the report's
parts add up to the fit's wall time. Each fit runs in a process of its own, with its backend."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import read_run

from rnnmon.analysis.fit_time import PARTS
from rnnmon.analysis.summary import summarize
from rnnmon.format.logdir import read_logdir

pytestmark = pytest.mark.slow  # a fit in a process of its own: 10-20 s each

FULL, PARTIAL = [[32, 16, 8], [32, 1]], [[5, 16, 8], [5, 1]]
SCRIPT = textwrap.dedent("""
    import json, sys, time
    import numpy as np, keras, rnnmon

    class Stopwatch(keras.callbacks.Callback):  # first in the list: it stamps just before the monitor's hooks
        def on_train_begin(self, logs=None):
            self.begin = time.perf_counter()

        def on_train_end(self, logs=None):
            self.end = time.perf_counter()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * 12 + 5, 16, 8)).astype("float32")  # 12 full batches and one of 5 per epoch
    y = x[:, :, :1].mean(axis=1)
    data, validation = (x, y), (x[:64], y[:64])
    if {loader}:  # torch's own loader, with worker processes started every epoch
        import torch
        tensors = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
        data = (torch.utils.data.DataLoader(tensors, batch_size=32, num_workers=2),)
        validation = torch.utils.data.DataLoader(torch.utils.data.Subset(tensors, range(64)), batch_size=32)
    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile={jit})
    watch = Stopwatch()
    model.fit(*data, batch_size=None if {loader} else 32, epochs=3, verbose=0, validation_data=validation,
              callbacks=[watch, rnnmon.UtilizationMonitor({logdir!r})])
    print(json.dumps({{"fit_s": watch.end - watch.begin}}))
""")


def _fit(tmp_path, backend: str, *, jit: str = '"auto"', loader: bool = False) -> tuple[dict, float]:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    env = {**os.environ, "KERAS_BACKEND": backend}
    script = SCRIPT.format(logdir=str(tmp_path), jit=jit, loader=loader)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    fit_s = json.loads(result.stdout.strip().splitlines()[-1])["fit_s"]
    summary = summarize(read_run(str(tmp_path)))
    assert summary["backend"] == backend and summary["steps"] == 39 and summary["status"] == "finished"
    files = {key: value for key, value in summarize(read_logdir(str(tmp_path))["rnnmon"]).items() if key != "run"}
    assert summarize(read_logdir(str(tmp_path), digest=True)["rnnmon"]) == {"run": "rnnmon", **files}  # its index
    return summary, fit_s


def _adds_up(summary: dict, fit_s: float) -> None:
    """The parts sum to the fit's wall time, as a stopwatch callback saw it, within 2%."""
    times = summary["time_s"]
    assert abs(times["fit"] - fit_s) <= 0.02 * fit_s, (times, fit_s)
    assert abs(sum(times[part] for part in PARTS) - fit_s) <= 0.02 * fit_s, (times, fit_s)


def _recompiled(summary: dict) -> dict:
    """The one step that compiled again: the first epoch's partial batch (later epochs reuse its program)."""
    [step] = [s for s in summary["slow_steps"] if s["cause"] == "recompile"]
    assert (step["step"], step["shapes"], step["previous_shapes"]) == (13, PARTIAL, FULL), step
    [finding] = [f for f in summary["findings"] if f["code"] == "RECOMPILE"]
    assert "step 13 on (5, 16, 8), (5, 1) after (32, 16, 8), (32, 1)" in finding["message"], finding["message"]
    assert "drop_remainder=True" in finding["advice"]
    times = summary["time_s"]
    assert times["recompiles"] == pytest.approx(step["excess_s"], abs=1e-3) and times["recompiles"] > 0.1
    assert finding["speedup"] == round(times["training"] / (times["training"] - times["recompiles"]), 2)
    return finding


def test_jax_names_the_partial_batch_that_compiled_a_second_program(tmp_path):
    summary, fit_s = _fit(tmp_path, "jax")
    _recompiled(summary)
    _adds_up(summary, fit_s)


def test_tensorflow_with_xla_names_the_partial_batch_that_compiled_again(tmp_path):
    summary, fit_s = _fit(tmp_path, "tensorflow", jit="True")
    _recompiled(summary)
    _adds_up(summary, fit_s)


def test_torch_with_a_dataloader_accounts_for_every_second_and_compiles_nothing_new(tmp_path):
    summary, fit_s = _fit(tmp_path, "torch", loader=True)
    _adds_up(summary, fit_s)
    assert PARTIAL in [record["shapes"] for record in read_run(str(tmp_path)).shapes]  # seen, yet no compile:
    assert "RECOMPILE" not in {f["code"] for f in summary["findings"]}  # eager torch runs any shape as it comes
