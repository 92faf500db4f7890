"""The callback audits the input the user passed to fit, as `rnnmon.audit(model, x)` does, on every backend.

Keras turns NumPy arrays, generators and `PyDataset`s into tf.data pipelines of its own (a `.map(permutation)`,
batching, `Dataset.from_generator` with autotune off); none of that is the user's to fix.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import BATCH, TESTS, read_run, sequences, tiny_model

import rnnmon
from rnnmon import UtilizationMonitor
from rnnmon.audit.pipeline import audit_pipeline


class Batches:
    """A `keras.utils.PyDataset` of 6 batches (built lazily, so importing this module needs no Keras)."""

    def __new__(cls, **kwargs):
        import keras

        class SequenceBatches(keras.utils.PyDataset):
            def __len__(self):
                return 6

            def __getitem__(self, index):
                x, y = sequences(1, seed=index)
                return x, y

        return SequenceBatches(**kwargs)


def _generator():
    for index in range(6):
        yield sequences(1, seed=index)


def _python_decode(features, labels):
    import tensorflow as tf

    out = tf.py_function(lambda f: f, [features], tf.float32)
    out.set_shape(features.shape)
    return out, labels


def _tf_data():
    import tensorflow as tf

    x, y = sequences(6)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).map(_python_decode)


def _recorded_codes(tmp_path, x, model=None, **fit_args) -> list[tuple[str, str]]:
    model = model or tiny_model()
    model.fit(x, epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))], **fit_args)
    findings = read_run(str(tmp_path)).findings
    from_audit = rnnmon.audit(model, x, batch_size=fit_args.get("batch_size"))
    assert sorted((f["code"], f["message"]) for f in findings) == sorted((f.code, f.message) for f in from_audit)
    return sorted((f["code"], f["severity"]) for f in findings)


@pytest.mark.usefixtures("no_nvml")
def test_numpy_arrays_get_no_finding_about_kerass_own_pipeline(tmp_path, traced_model):
    x, y = sequences(6)
    assert _recorded_codes(tmp_path, x, model=traced_model, y=y, batch_size=BATCH) == []


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_numpy_arrays_with_a_small_batch_get_small_batch(tmp_path):
    x, y = sequences(2)
    assert _recorded_codes(tmp_path, x, y=y, batch_size=8) == [("SMALL_BATCH", "warning")]


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_tf_data_findings_name_the_users_function_and_where_it_is_defined(tmp_path):
    codes = _recorded_codes(tmp_path, _tf_data())
    assert ("PIPELINE_PY_FUNCTION", "warning") in codes
    [finding] = [f for f in read_run(str(tmp_path)).findings if f["code"] == "PIPELINE_PY_FUNCTION"]
    line = _python_decode.__code__.co_firstlineno
    assert f"MapDataset(_python_decode) (defined at test_user_input_audit.py:{line})" in finding["message"]


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_generator_gets_data_not_tf_naming_the_generator(tmp_path):
    assert _recorded_codes(tmp_path, _generator()) == [("DATA_NOT_TF", "warning")]
    [finding] = read_run(str(tmp_path)).findings
    assert "Python generator (_generator) (defined at test_user_input_audit.py:" in finding["message"]
    assert "FlatMapDataset" not in finding["where"]


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_single_worker_py_dataset_gets_data_not_tf(tmp_path):
    assert _recorded_codes(tmp_path, Batches()) == [("DATA_NOT_TF", "warning")]
    # The class has no __init__ of its own (as in the field trial): the workers go where it is created.
    [finding] = read_run(str(tmp_path)).findings
    assert finding["advice"].startswith("Create it as `SequenceBatches(workers=4, use_multiprocessing=True)`")


@pytest.mark.parametrize(("backend", "how"), [("tensorflow", "one batch at a time on a single thread"),
                                               ("jax", "in the training loop itself, one batch before each step"),
                                               ("torch", "in the training loop itself, one batch before each step")])
def test_a_serial_py_dataset_is_explained_for_the_backend_that_reads_it(backend, how):
    # TensorFlow reads it ahead on a tf.data thread; JAX and torch call __getitem__ between steps.
    [finding] = audit_pipeline(Batches(), backend=backend)
    assert finding.code == "DATA_NOT_TF" and how in finding.message
    assert "workers=4, use_multiprocessing=True" in finding.advice


def test_py_dataset_with_its_own_init_is_told_to_pass_workers_to_super():
    import keras

    class Windows(keras.utils.PyDataset):
        def __init__(self, length, **kwargs):
            super().__init__(**kwargs)
            self.length = length

        def __len__(self):
            return self.length

        def __getitem__(self, index):
            return sequences(1, seed=index)

    class Shuffled(Windows):
        pass

    [finding] = rnnmon.audit(tiny_model(), Shuffled(6))
    assert finding.advice.startswith("Call `super().__init__(workers=4, use_multiprocessing=True, **kwargs)` "
                                     "in `Windows.__init__`")


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize("use_multiprocessing", [False, True], ids=["threads", "processes"])
def test_py_dataset_with_workers_gets_no_pipeline_advice(tmp_path, use_multiprocessing):
    # Keras turns tf.data autotune off for it on purpose: its own workers prefetch.
    data = Batches(workers=2, use_multiprocessing=use_multiprocessing)
    assert _recorded_codes(tmp_path, data) == []


SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, keras, rnnmon
    sys.path[:0] = [{tests!r}, {here!r}]
    from conftest import tiny_model
    from test_user_input_audit import Batches, _generator, _tf_data

    inputs = {{"tf.data": _tf_data, "generator": _generator, "py-dataset-threads": lambda: Batches(workers=2)}}
    out = {{}}
    for name, make in inputs.items():
        data, logdir = make(), {logdir!r} + "/" + name
        tiny_model().fit(data, epochs=1, verbose=0, callbacks=[rnnmon.UtilizationMonitor(logdir)])
        out[name] = logdir
    print(json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends_audit_the_users_input(tmp_path, backend):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    env = {**os.environ, "KERAS_BACKEND": backend}
    script = SCRIPT.format(tests=TESTS, here=os.path.dirname(os.path.abspath(__file__)), logdir=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    logdirs = json.loads(result.stdout.strip().splitlines()[-1])
    codes = {name: sorted(f["code"] for f in read_run(logdir).findings) for name, logdir in logdirs.items()}
    assert codes == {"tf.data": ["PIPELINE_NO_PREFETCH", "PIPELINE_PY_FUNCTION", "PIPELINE_SERIAL_MAP"],
                     "generator": ["DATA_NOT_TF"], "py-dataset-threads": []}, codes
