"""What the partial last batch of an epoch costs, with and without UtilizationMonitor.

A tiny LSTM (16 units, 16x8 inputs) trains on 5 full batches of 32 and one of 27 per epoch, for `--epochs`
epochs, always a fresh model (each fit traces from scratch, as a user's first fit does). Fits with and
without the monitor alternate (AB, BA). A callback both arms carry stamps every step; the report gives the
partial batch's step time (each epoch's last step) against the full batches of the same fit: median and
worst over all fits. Before the fix, the monitored arm's partial batch traced Keras's step again
(0.3-1.2 s once per fit); now it costs what a full batch does.

Usage:
    python benchmarks/partial_batch.py [--repeats 6] [--epochs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import keras
from conftest import BATCH, sequences, tiny_model
from fake_nvml import library_missing

FULL_BATCHES = 5


class StepTimes(keras.callbacks.Callback):
    """The duration of every step, in ms, grouped by epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[list[float]] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append([])

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.epochs[-1].append((time.perf_counter() - self._begin) * 1e3)


def _dataset():
    import tensorflow as tf

    x, y = sequences(FULL_BATCHES + 1)
    keep = FULL_BATCHES * BATCH + 27
    return tf.data.Dataset.from_tensor_slices((x[:keep], y[:keep])).batch(BATCH)


def _fit(monitored: bool, epochs: int, logdir: str) -> StepTimes:
    from rnnmon import UtilizationMonitor

    times = StepTimes()  # first, so the monitor's own hooks count inside the step it stamps
    callbacks = [times] + ([UtilizationMonitor(logdir)] if monitored else [])
    tiny_model().fit(_dataset(), epochs=epochs, verbose=0, callbacks=callbacks)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    partial: dict[str, list[float]] = {"plain": [], "monitored": []}
    full: dict[str, list[float]] = {"plain": [], "monitored": []}
    with library_missing(), tempfile.TemporaryDirectory() as logdir:
        for repeat in range(args.repeats):
            order = (False, True) if repeat % 2 == 0 else (True, False)
            for monitored in order:
                arm = "monitored" if monitored else "plain"
                times = _fit(monitored, args.epochs, os.path.join(logdir, f"{repeat}-{arm}"))
                partial[arm] += [epoch[-1] for epoch in times.epochs]
                full[arm] += [ms for epoch in times.epochs[1:] for ms in epoch[:-1]]  # past the first trace
    result = {arm: {"partial_median_ms": round(statistics.median(partial[arm]), 2),
                    "partial_worst_ms": round(max(partial[arm]), 2),
                    "full_median_ms": round(statistics.median(full[arm]), 2),
                    "full_worst_ms": round(max(full[arm]), 2)} for arm in partial}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for arm, numbers in result.items():
            print(f"{arm:10s} partial batch median {numbers['partial_median_ms']:8.2f} ms, worst "
                  f"{numbers['partial_worst_ms']:8.2f} ms | full batches median {numbers['full_median_ms']:.2f} ms, "
                  f"worst {numbers['full_worst_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
