"""`rnnmon demo`: the same small LSTM trained twice, once input-bound and once tuned, then the report.

`input_bound` decodes each batch in Python (`tf.py_function`) with a serial map and no prefetch; `tuned` runs
the same decoding with a parallel map (on a thread pool larger than the core count, since the decode waits on
I/O) and a prefetch. Each run takes a few seconds on 2 CPU cores.

Example:
    $ rnnmon demo --logdir runs
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
import warnings

import numpy as np

from rnnmon.findings import duration_text, training_speedup

SEQUENCES, TIMESTEPS, FEATURES, BATCH = 4096, 32, 8, 32
DECODE_S = 0.03  # the Python-side "decode" work per batch (file read, parsing): 3x a quiet 2-core step,
# so the first run stays input-bound when a loaded machine doubles the step


def make_dataset(tuned: bool, seed: int = 0):
    """Synthetic sequences whose every batch passes through a Python decode step."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SEQUENCES, TIMESTEPS, FEATURES)).astype("float32")
    y = (x[:, :, 0].mean(axis=1, keepdims=True) > 0).astype("float32")

    def decode(batch: np.ndarray) -> np.ndarray:
        time.sleep(DECODE_S)  # I/O-like latency that a parallel map can overlap
        return np.asarray(batch, dtype=np.float32) * 1.0

    def python_decode(features, labels):
        decoded = tf.py_function(decode, [features], tf.float32)
        decoded.set_shape(features.shape)
        return decoded, labels

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if tuned:
        options = tf.data.Options()
        options.threading.private_threadpool_size = 16  # the decode waits on I/O: run more calls than cores
        return (dataset.map(python_decode, num_parallel_calls=16).prefetch(tf.data.AUTOTUNE)
                .with_options(options))
    return dataset.map(python_decode)


def make_model():
    import keras

    model = keras.Sequential([keras.Input((TIMESTEPS, FEATURES)), keras.layers.LSTM(32), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def run_demo(logdir: str = "runs") -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from rnnmon import UtilizationMonitor
    from rnnmon.report import build_report, render_text

    keras.utils.set_random_seed(0)
    warnings.filterwarnings("ignore", message="`shuffle=True` was passed")
    for name, tuned in (("input_bound", False), ("tuned", True)):
        run_dir = os.path.join(logdir, name)
        shutil.rmtree(os.path.join(run_dir, "rnnmon"), ignore_errors=True)
        print(f"Training {name} ...", flush=True)
        make_model().fit(make_dataset(tuned), validation_data=make_dataset(tuned, seed=1).take(8), epochs=2,
                         verbose=0, callbacks=[UtilizationMonitor(run_dir)])
    print()
    report = build_report(logdir)
    print(render_text(report))
    print(predicted_vs_achieved(report))
    print(f"\nOpen the \"RNN Monitor\" tab:  {tensorboard_command(logdir)}   then http://localhost:6006/#rnnmon")
    return 0


def tensorboard_command(logdir: str) -> str:
    """`tensorboard --logdir LOGDIR` as it can be run from here: the `tensorboard` of this Python's environment (by
    its path when PATH finds another one or none, as in a virtual environment that is not activated)."""
    beside = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    if not os.path.isfile(beside):  # an environment without the script: the module runs the same program
        program = f"{shlex.quote(sys.executable)} -m tensorboard.main"
    else:
        found = shutil.which("tensorboard")
        if found and os.path.samefile(found, beside):
            program = "tensorboard"
        else:
            relative = os.path.relpath(beside)
            program = shlex.quote(beside if relative.startswith("..") else relative)
    return f"{program} --logdir {shlex.quote(logdir)}"


def predicted_vs_achieved(report: dict) -> str:
    """The input-bound run's top prediction (its training time without the cause) next to the tuned run's."""
    runs = {run["run"].split("/")[0]: run for run in report["runs"]}
    slow, fast = runs.get("input_bound"), runs.get("tuned")
    if not slow or not fast or not slow["time_s"]["training"] or not fast["time_s"]["training"]:
        return ""
    training, tuned = slow["time_s"]["training"], fast["time_s"]["training"]
    achieved = (f"the tuned run took {duration_text(tuned)} after its warm-up: "
                f"{training_speedup(training, tuned):.2f}x")
    bounds = [f for f in slow["findings"] if f.get("speedup")]
    if not bounds:
        return f"\nAchieved: {achieved} (no measured finding predicted one)."
    top = bounds[0]
    return (f"\nPredicted by {top['code']}: {duration_text(training / top['speedup'])} instead of "
            f"{duration_text(training)} after the warm-up, {top['speedup']:.2f}x; achieved: {achieved}.")
