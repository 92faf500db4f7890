"""Ragged text padded per batch: what rnnmon predicts each fix gains, against what each fix achieves.

The seeds' workload: token sequences of text-like lengths (log-normal, 2-120), an embedding and an LSTM
(`--units`), batches of 16 padded to their own longest sequence, so most batches bring a new length and XLA (TensorFlow,
`jit_compile=True`) or JAX compiles the step again. The RECOMPILE finding predicts two fixes from that run's own
numbers (rnnmon.analysis.compile_advice): one padded length, and buckets padded to their boundaries. Each fix is
then run as the finding says (its length, its bucket lengths; on TensorFlow through tf.data's own `padded_batch`
and `bucket_by_sequence_length`), and its training time (wall time after the warm-up, as rnnmon measures it) is
set against the prediction. Every fit is monitored and runs in a process of its
own; the arms alternate per repeat. The machine's load (1-minute average) is printed beside each.

Usage:
    python benchmarks/ragged_lengths.py [--backends tensorflow jax] [--examples 480] [--units 64] [--repeats 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

BATCH = 16


def _child(arm: str, logdir: str, examples: int, lengths: list[int], units: int) -> None:
    """One monitored fit: `arm` is "per-batch", "one-length" (pad to lengths[-1]) or "buckets" (pad to lengths)."""
    import keras
    import numpy as np

    import rnnmon

    rng = np.random.default_rng(0)
    sizes = np.clip(rng.lognormal(2.6, 0.7, size=examples), 2, 120).astype(int)
    tokens = np.zeros((examples, 120), "int32")
    for row, size in enumerate(sizes):
        tokens[row, :size] = rng.integers(1, 50, size=size)
    labels = (sizes % 2).astype("float32")
    if arm == "buckets":  # examples grouped by bucket, each batch padded to its bucket's length, no remainder
        bucket = np.searchsorted(lengths, sizes)
        batches = [(members[i:i + BATCH], lengths[b]) for b in range(len(lengths))
                   for members in [rng.permutation(np.flatnonzero(bucket == b))]
                   for i in range(0, len(members) - BATCH + 1, BATCH)]
        batches = [batches[i] for i in rng.permutation(len(batches))]
    else:
        batches = [(np.arange(i, i + BATCH), None) for i in range(0, examples - BATCH + 1, BATCH)]
        batches = [(rows, int(sizes[rows].max()) if arm == "per-batch" else lengths[-1]) for rows, _ in batches]

    def batch(index: int) -> tuple:
        rows, width = batches[index]
        return tokens[rows, :width], labels[rows]

    class Batches(keras.utils.PyDataset):
        def __len__(self) -> int:
            return len(batches)

        def __getitem__(self, index: int) -> tuple:
            return batch(index)

    data, steps_per_epoch = Batches(), None
    if keras.backend.backend() == "tensorflow":  # the pipeline as the finding tells a tf.data user to write it
        data, steps_per_epoch = _tf_pipeline(arm, tokens, sizes, labels, lengths)
    model = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(50, 8),
                              keras.layers.LSTM(units), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    model.fit(data, epochs=2, steps_per_epoch=steps_per_epoch, verbose=0,
              callbacks=[rnnmon.UtilizationMonitor(logdir, audit=False)])


def _tf_pipeline(arm: str, tokens, sizes, labels, lengths: list[int]) -> tuple:
    """The same examples as a tf.data pipeline, and its batches per epoch: `padded_batch` per batch or to one
    length, or `bucket_by_sequence_length` with the boundaries and flags RECOMPILE names (each pads to its boundary
    - 1). Repeated, with `steps_per_epoch`, as the epoch-end advice says: where each epoch made a new iterator,
    tf.data's autotuning held the old one's teardown for 2.5-3.5 s at one epoch boundary in three of four fits
    under XLA at load 6-7 (none with autotuning off, none repeated), which no prediction of the steps can know."""
    import numpy as np
    import tensorflow as tf

    examples = tf.data.Dataset.from_tensor_slices((tokens, sizes, labels)).map(lambda x, n, y: (x[:n], y))
    if arm == "buckets":
        boundaries = [length + 1 for length in lengths]
        members = np.bincount(np.searchsorted(boundaries, sizes, side="right"), minlength=len(boundaries) + 1)
        batches = examples.bucket_by_sequence_length(
            lambda x, y: tf.shape(x)[0], boundaries, [BATCH] * (len(lengths) + 1),
            pad_to_bucket_boundary=True, drop_remainder=True)
        return batches.repeat(), int((members // BATCH).sum())
    shape = [lengths[-1]] if arm == "one-length" else [None]
    return examples.padded_batch(BATCH, padded_shapes=(shape, []), drop_remainder=True).repeat(), len(sizes) // BATCH


def _fit(backend: str, arm: str, examples: int, lengths: list[int], units: int) -> dict:
    from rnnmon.analysis.summary import summarize
    from rnnmon.format.logdir import read_logdir

    with tempfile.TemporaryDirectory() as logdir:
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
        subprocess.run([sys.executable, __file__, "--child", arm, logdir, str(examples), json.dumps(lengths),
                        str(units)],
                       env=env, check=True, capture_output=True)
        summary = summarize(read_logdir(logdir)["rnnmon"])
    return {"training_s": summary["time_s"]["training"], "recompiles_s": summary["time_s"]["recompiles"],
            "verdict": summary["verdict"], "fixes": summary["compile_fixes"], "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax"])
    parser.add_argument("--examples", type=int, default=480)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--units", type=int, default=64, help="LSTM units: the steps' own work")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        arm, logdir, examples, lengths, units = args.child
        _child(arm, logdir, int(examples), json.loads(lengths), int(units))
        return
    results = []
    for backend in args.backends:
        rows: dict[str, list] = {"per-batch": [], "one-length": [], "buckets": []}
        for _ in range(args.repeats):
            padded = _fit(backend, "per-batch", args.examples, [], args.units)
            rows["per-batch"].append(padded)
            fixes = padded["fixes"]
            for arm, key in (("one-length", "one_length"), ("buckets", "buckets")):
                lengths = [fixes["one_length"]["length"]] if arm == "one-length" else fixes["buckets"]["lengths"]
                achieved = _fit(backend, arm, args.examples, lengths, args.units)
                achieved["predicted_s"] = fixes[key]["training_s"]
                rows[arm].append(achieved)
        base = statistics.median(r["training_s"] for r in rows["per-batch"])
        for arm in ("one-length", "buckets"):
            achieved = statistics.median(r["training_s"] for r in rows[arm])
            predicted = statistics.median(r["predicted_s"] for r in rows[arm])
            results.append({"backend": backend, "fix": arm, "per_batch_s": round(base, 3),
                            "predicted_s": predicted, "achieved_s": round(achieved, 3),
                            "predicted_speedup": round(base / predicted, 2) if predicted else None,
                            "achieved_speedup": round(base / achieved, 2) if achieved else None,
                            "error": round(predicted / achieved - 1, 3) if achieved else None,
                            "verdict": rows["per-batch"][0]["verdict"],
                            "buckets": rows["per-batch"][0]["fixes"]["buckets"]["lengths"],
                            "load": [round(r["load"], 2) for r in rows["per-batch"] + rows[arm]]})
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'backend':<11} {'fix':<11} {'per-batch':>9} {'predicted':>9} {'achieved':>9} {'pred x':>7} "
          f"{'got x':>7} {'error':>7}  load")
    for r in results:
        print(f"{r['backend']:<11} {r['fix']:<11} {r['per_batch_s']:>8.2f}s {r['predicted_s']:>8.2f}s "
              f"{r['achieved_s']:>8.2f}s {r['predicted_speedup']:>6.2f}x {r['achieved_speedup']:>6.2f}x "
              f"{100 * r['error']:>+6.1f}%  {r['load']}")


if __name__ == "__main__":
    main()
