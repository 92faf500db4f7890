"""Input timing under tf.distribute.MirroredStrategy over two logical CPUs, in a worker process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import read_run

pytestmark = pytest.mark.slow  # two fits in a process of its own: 10 s

WORKER = textwrap.dedent("""
    import json, sys, time
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras, rnnmon

    def stall(batch):
        time.sleep(0.01)
        return batch

    def stage(x, y):
        out = tf.py_function(stall, [x], tf.float32)
        out.set_shape(x.shape)
        return out, y

    def train(callbacks):
        keras.utils.set_random_seed(1)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        x = np.random.default_rng(0).normal(size=(64 * 20, 16, 8)).astype("float32")
        data = tf.data.Dataset.from_tensor_slices((x, x[:, :, :1].mean(axis=1))).batch(64).map(stage)
        with strategy.scope():
            model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse")
        history = model.fit(data, epochs=2, verbose=0, callbacks=callbacks)
        return history.history["loss"], [w.tolist() for w in model.get_weights()]

    plain = train([])
    watched = train([rnnmon.UtilizationMonitor(sys.argv[1], audit=False)])
    print(json.dumps({"same_loss": plain[0] == watched[0], "same_weights": plain[1] == watched[1]}))
""")


def test_mirrored_strategy_is_timed_and_unchanged(tmp_path):
    result = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"same_loss": True, "same_weights": True}
    run = read_run(str(tmp_path))
    assert run.info["input_wait"] == "measured" and len(run.steps) == 40
    steady = run.steps[~np.isnan(run.steps[:, 5])]
    period_ms = np.median((steady[:, 3] - steady[:, 2]) * 1e3 + steady[:, 5])
    assert period_ms >= 9.5  # the 10 ms stall paces the steps ...
    assert 1.0 < np.median(steady[:, 4]) < period_ms  # ... and the part compute does not overlap is waited for
