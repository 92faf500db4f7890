"""Ragged text padded per batch, the seeds' own workload: most batches bring a new length. With XLA or JAX the step
compiles per shape, and the report says so from the frameworks' own compile signals; without XLA nothing compiles
and nothing is called a recompile. Each fit runs in a process of its own, with its backend."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import read_run

from rnnmon.analysis.summary import summarize

pytestmark = pytest.mark.slow  # a fit in a process of its own: 10-40 s each

SCRIPT = textwrap.dedent("""
    import numpy as np, keras, rnnmon

    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(2.6, 0.7, size={examples}), 2, 120).astype(int)  # text-like: a long tail
    tokens = [rng.integers(1, 50, size=n).astype("int32") for n in lengths]
    labels = (lengths % 2).astype("float32")
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        data = tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
            tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.float32)))
        if {bucketed}:  # buckets, but each batch padded to its own longest: the fix half made
            data = data.bucket_by_sequence_length(lambda x, y: tf.shape(x)[0], [8, 16, 32], [16] * 4)
        else:
            data = data.padded_batch(16)
    else:  # JAX reads a Python generator in the training loop
        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return len(tokens) // 16

            def __getitem__(self, index):
                chunk = range(16 * index, 16 * index + 16)
                width = max(lengths[i] for i in chunk)
                x = np.zeros((16, width), "int32")
                for row, i in enumerate(chunk):
                    x[row, :lengths[i]] = tokens[i]
                return x, labels[list(chunk)]
        data = Batches()
    model = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(50, 8),
                              keras.layers.LSTM(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile={jit})
    model.fit(data, epochs=2, verbose=0, callbacks=[rnnmon.UtilizationMonitor({logdir!r})])
""")


def _fit(tmp_path, backend: str, *, jit: bool, examples: int = 16 * 20, bucketed: bool = False) -> dict:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    env = {**os.environ, "KERAS_BACKEND": backend}
    script = SCRIPT.format(logdir=str(tmp_path), jit=jit, examples=examples, bucketed=bucketed)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return summarize(read_run(str(tmp_path)))


def _compile_bound(summary: dict, source: str) -> dict:
    """Compiles are most of the training time, the verdict says so, and both fixes are named with predictions."""
    times = summary["time_s"]
    assert times["recompiles"] >= 0.5 * times["training"], times
    assert summary["verdict"] == "compile-bound", (summary["verdict"], times)
    assert "small" not in summary["summary"] and "compiled again" in summary["summary"]
    [finding] = [f for f in summary["findings"] if f["code"] == "RECOMPILE"]
    assert f"({source} compile events)" in finding["message"], finding["message"]
    fixes = summary["compile_fixes"]
    assert fixes["one_length"]["training_s"] < times["training"] - times["recompiles"] + 1.0, fixes
    assert fixes["buckets"]["compiles"] >= 2, fixes
    assert "one compile" in finding["advice"] and f"{fixes['buckets']['compiles']} compiles" in finding["advice"]
    assert finding["speedup"] >= 3, finding
    return finding


def test_tensorflow_with_xla_compiles_per_length_and_says_so(tmp_path):
    finding = _compile_bound(_fit(tmp_path, "tensorflow", jit=True), "xla")
    assert "padded_batch(n, padded_shapes=" in finding["advice"]
    assert "bucket_by_sequence_length(length_fn, bucket_boundaries=[" in finding["advice"]


def test_jax_compiles_per_length_timed_by_its_own_events(tmp_path):
    summary = _fit(tmp_path, "jax", jit=True)
    finding = _compile_bound(summary, "jax")
    assert "pad every batch to length" in finding["advice"]  # a PyDataset: no tf.data call to give
    compiles = read_run(str(tmp_path)).compiles
    assert compiles and all(record["seconds"] is not None and record["seconds"] > 0 for record in compiles)


def test_tensorflow_without_xla_longer_sequences_are_no_recompile(tmp_path):
    summary = _fit(tmp_path, "tensorflow", jit=False)
    assert read_run(str(tmp_path)).compiles == []  # traced in the warm-up only
    assert summary["time_s"]["recompiles"] == 0 and summary["slow_step_count"]["recompile"] == 0
    assert "RECOMPILE" not in {f["code"] for f in summary["findings"]}
    assert summary["verdict"] != "compile-bound"


def test_a_pipeline_that_buckets_already_is_told_what_it_misses_not_to_bucket(tmp_path):
    summary = _fit(tmp_path, "tensorflow", jit=True, bucketed=True)
    assert read_run(str(tmp_path)).info["input_batching"] == "bucket_by_sequence_length"
    [finding] = [f for f in summary["findings"] if f["code"] == "RECOMPILE"]
    assert "buckets already" in finding["advice"] and "pad_to_bucket_boundary=True" in finding["advice"]
    assert "bucket_by_sequence_length(length_fn" not in finding["advice"]


TORCH_SCRIPT = textwrap.dedent("""
    import numpy as np, keras, rnnmon

    rng = np.random.default_rng(0)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 12

        def __getitem__(self, index):
            length = [5, 5, 9, 5, 13, 9, 17, 5, 21, 9, 25, 5][index]
            return rng.normal(size=(8, length, 4)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")

    model = keras.Sequential([keras.Input((None, 4)), keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    model.fit(Batches(), epochs=1, verbose=0, callbacks=[rnnmon.UtilizationMonitor({logdir!r}, audit=False)])
""")


def test_torch_compile_counts_its_own_graphs(tmp_path):
    """torch.compile compiles once more after the warm-up (its guards fail on the second call: a new length, or
    the optimizer's state), then one graph with a dynamic length serves every other length."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    result = subprocess.run([sys.executable, "-c", TORCH_SCRIPT.format(logdir=str(tmp_path))], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = read_run(str(tmp_path))
    assert run.info["compiles"] == "torch.compile"
    records = run.compiles  # one, or a few where a loaded CI machine saw dynamo compile again: never per length
    assert records and records[0]["step"] == 2 and len(records) <= 3, records
    assert all(r["source"] == "torch.compile" and r["count"] >= 1 for r in records), records
    summary = summarize(run)
    assert summary["slow_step_count"]["recompile"] == len(records) and summary["time_s"]["recompiles"] > 0.5


def test_a_second_fit_on_programs_xla_already_compiled_compiles_nothing(tmp_path):
    """`fit(epochs=1)` in a loop (as keras-io's examples do): XLA keeps its programs with Keras's train function."""
    script = textwrap.dedent(f"""
        import numpy as np, keras, rnnmon
        rng = np.random.default_rng(0)
        batches = [rng.normal(size=(8, length, 4)).astype("float32") for length in (5, 9, 13, 5, 9, 13)]

        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return len(batches)

            def __getitem__(self, index):
                return batches[index], np.zeros((8, 1), "float32")

        model = keras.Sequential([keras.Input((None, 4)), keras.layers.LSTM(4), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse", jit_compile=True)
        monitor = rnnmon.UtilizationMonitor({str(tmp_path)!r}, audit=False)
        for _ in range(2):
            model.fit(Batches(), epochs=1, verbose=0, callbacks=[monitor])
    """)
    result = subprocess.run([sys.executable, "-c", script], env={**os.environ, "KERAS_BACKEND": "tensorflow"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = read_run(str(tmp_path))
    steps = [record["step"] for record in run.compiles]
    assert len(steps) == 2 and max(steps) <= 6, run.compiles  # the first fit's lengths 9 and 13, once each
