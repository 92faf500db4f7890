"""What rnnmon predicts a fit gains without a cause, against what the fit without it achieves.

Every measured finding's speed-up predicts one quantity: the fit's training time (its wall time after the
warm-up) without the cause, from what the run measured (`training_without_s` in the summary). For each injected
cause below, fits with and without it alternate (AB, BA, ...), each fit a run of its own; the prediction made
from each fit with the cause is set against the training time of the fits without it (medians over the
repeats). Beside them: the median step less its input wait in each arm (where the cause also slowed the
steps' own work, removing it gains more than its time), the top finding of the fits with the cause, and the
machine's load (1-minute load average): on a shared machine the steps themselves change with it.

Causes (a tiny LSTM, 16 units, 16x8 inputs, batch 32, `--batches` per epoch, 2 epochs; each step also waits
`--device-ms` inside the compiled step holding no CPU, as the host waits for a GPU; 0 makes it CPU compute alone):
- generator:  a Python generator that sleeps 20 ms per batch, against the same generator without the sleep
              (predicted: without the input wait beyond the fetch floor);
- callback before / after: a callback sleeping 15 ms in `on_train_batch_end`, listed before or after the
              monitor, against no such callback (predicted: without the callbacks' batch hooks);
- checkpoint: `ModelCheckpoint(save_freq=20)` writing the weights every 20 steps, against none (the same);
- validation: validation data 3x the training set, against none (predicted: without validation);
- py_function: a serial `tf.py_function` map doing ~25 ms of numpy per batch, against no map (predicted:
              without the input wait beyond the fetch floor).

Usage:
    python benchmarks/speedup_prediction.py [--repeats 5] [--batches 40] [--device-ms 10] [--causes ...] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import keras
import numpy as np
from conftest import BATCH, sequences, tiny_model
from fake_nvml import library_missing

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize
from rnnmon.format.logdir import read_logdir


class Sleeper(keras.callbacks.Callback):
    """Host work after every step: a 15 ms logging call."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.015)


def _generator(batches: int, sleep_s: float):
    x, y = sequences(batches)

    def generate():
        while True:
            for i in range(batches):
                if sleep_s:
                    time.sleep(sleep_s)
                yield x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]

    return generate()


def _tf_data(batches: int, py_function: bool):
    import tensorflow as tf

    x, y = sequences(batches)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if not py_function:
        return dataset.prefetch(2)

    def decode(features):
        work = np.asarray(features)
        for _ in range(1200):  # ~25 ms of numpy on one core: a decode written in Python
            work = np.sort(work, axis=1)
        return work

    def python_decode(features, labels):
        decoded = tf.py_function(decode, [features], tf.float32)
        decoded.set_shape(features.shape)
        return decoded, labels

    return dataset.map(python_decode)  # serial, as a first pipeline is written


# name -> (the quantity predicted, fit arguments with the cause, fit arguments without it); each builder gets
# (batches, temporary folder) and returns (fit kwargs, callbacks before the monitor, callbacks after it).
Arm = Callable[[int, str], tuple[dict[str, Any], list, list]]
CAUSES: dict[str, tuple[str, Arm, Arm]] = {
    "generator": ("input_wait",
                  lambda n, _: ({"x": _generator(n, 0.020), "steps_per_epoch": n}, [], []),
                  lambda n, _: ({"x": _generator(n, 0.0), "steps_per_epoch": n}, [], [])),
    "callback_before": ("callbacks",
                        lambda n, _: ({"x": _tf_data(n, False)}, [Sleeper()], []),
                        lambda n, _: ({"x": _tf_data(n, False)}, [], [])),
    "callback_after": ("callbacks",
                       lambda n, _: ({"x": _tf_data(n, False)}, [], [Sleeper()]),
                       lambda n, _: ({"x": _tf_data(n, False)}, [], [])),
    "checkpoint": ("callbacks",
                   lambda n, tmp: ({"x": _tf_data(n, False)}, [], [keras.callbacks.ModelCheckpoint(
                       os.path.join(tmp, "ckpt.weights.h5"), save_weights_only=True, save_freq=20)]),
                   lambda n, _: ({"x": _tf_data(n, False)}, [], [])),
    "validation": ("validation",
                   lambda n, _: ({"x": _tf_data(n, False), "validation_data": _tf_data(3 * n, False)}, [], []),
                   lambda n, _: ({"x": _tf_data(n, False)}, [], [])),
    "py_function": ("input_wait",
                    lambda n, _: ({"x": _tf_data(n, True)}, [], []),
                    lambda n, _: ({"x": _tf_data(n, False)}, [], [])),
}


def _fit(model: Any, arm: Arm, batches: int, logdir: str, tmp: str) -> dict[str, Any]:
    kwargs, before, after = arm(batches, tmp)
    monitor = UtilizationMonitor(logdir, audit=False)
    model.fit(**kwargs, epochs=2, verbose=0, callbacks=[*before, monitor, *after])
    [run] = read_logdir(logdir).values()
    return summarize(run)


def measure(cause: str, repeats: int, batches: int, device_s: float, tmp: str) -> dict[str, Any]:
    quantity, with_cause, without_cause = CAUSES[cause]
    models = {"with": tiny_model(device_s=device_s), "without": tiny_model(device_s=device_s)}
    arms = {"with": with_cause, "without": without_cause}
    for name, model in models.items():  # trace each model once, outside the repeats
        _fit(model, arms[name], batches, os.path.join(tmp, f"{cause}-{name}-trace"), tmp)
    predicted, achieved, training, findings, load = [], [], [], collections.Counter(), []
    compute_ms: dict[str, list[float]] = {"with": [], "without": []}  # the median step less its input wait
    for repeat in range(repeats):
        load.append(os.getloadavg()[0])
        for name in ("with", "without") if repeat % 2 == 0 else ("without", "with"):
            summary = _fit(models[name], arms[name], batches, os.path.join(tmp, f"{cause}-{name}-{repeat}"), tmp)
            compute_ms[name].append(summary["step_ms"]["median"] - (summary["input_wait_ms"] or {}).get("median", 0))
            if name == "without":
                achieved.append(summary["time_s"]["training"])
                continue
            training.append(summary["time_s"]["training"])
            predicted.append(summary["training_without_s"][quantity])
            measured = [f for f in summary["findings"] if f.get("speedup")]
            findings[f"{measured[0]['code']} {measured[0]['speedup']:.2f}x" if measured else "no finding"] += 1
    base, predicted_s, achieved_s = (statistics.median(v) for v in (training, predicted, achieved))
    return {"cause": cause, "quantity": quantity, "training_s": round(base, 3),
            "predicted_s": round(predicted_s, 3), "achieved_s": round(achieved_s, 3),
            "predicted_x": round(base / predicted_s, 2), "achieved_x": round(base / achieved_s, 2),
            "achieved_over_predicted": round(predicted_s / achieved_s, 2),
            "compute_ms": {name: round(statistics.median(values), 2) for name, values in compute_ms.items()},
            "top_finding": findings.most_common(1)[0][0], "load": [round(min(load), 2), round(max(load), 2)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--device-ms", type=float, default=10.0)
    parser.add_argument("--causes", nargs="*", default=list(CAUSES), choices=list(CAUSES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.getLogger("rnnmon").setLevel(logging.ERROR)  # "CPU-only mode", once per fit
    results = []
    with library_missing(), tempfile.TemporaryDirectory() as tmp:
        for cause in args.causes:
            results.append(measure(cause, args.repeats, args.batches, args.device_ms / 1e3, tmp))
            if not args.json:
                r = results[-1]
                print(f"{r['cause']:16s} training {r['training_s']:6.2f} s | predicted without it "
                      f"{r['predicted_s']:6.2f} s ({r['predicted_x']:.2f}x) | achieved {r['achieved_s']:6.2f} s "
                      f"({r['achieved_x']:.2f}x) | achieved/predicted x {r['achieved_over_predicted']:.2f} | "
                      f"step less wait {r['compute_ms']['with']:.1f} / {r['compute_ms']['without']:.1f} ms | "
                      f"top finding {r['top_finding']} | load {r['load'][0]:.2f}-{r['load'][1]:.2f}", flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
