"""Shared pieces for rnnmon's tests: tiny real models, tf.data pipelines with injected stalls, fake NVML.

Only the NVML C library is faked (tests/fake_nvml.py); everything else is the real thing.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Indexes a reader builds for runs it cannot index beside (rnnmon.format.index_build) go here, not the user's cache
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="rnnmon-tests-cache-")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the helpers: fake_nvml, synthetic_runs
# With PYTHONDONTWRITEBYTECODE set (as on the development machines) every run compiled rnnmon and rewrote and
# compiled each test module again: 3-4 s of the fast loop's collection. The tests keep their bytecode, and the
# Pythons they start keep theirs, in the __pycache__ folders git ignores (docs/testing.md).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    sys.dont_write_bytecode = False

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

TIMESTEPS, FEATURES, BATCH = 16, 8, 32


def tiny_model(seed: int = 0, steps_per_execution: int = 1, units: int = 16, device_s: float = 0.0):
    """An LSTM regressor: with 16 units about 1.5 ms per step on a CPU.

    device_s: each step also waits this long inside the compiled function, holding neither a CPU nor the GIL, as
    the host waits while a GPU computes. The input pipeline can work meanwhile, as on a GPU machine; on a CPU
    alone its threads compete with the step's compute for the same cores.
    """
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((TIMESTEPS, FEATURES)), keras.layers.LSTM(units), keras.layers.Dense(1)]
    model = keras.Sequential(layers + ([_device_time(device_s)] if device_s else []))
    model.compile(optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    return model


def _device_time(seconds: float):
    """A layer that passes its input through after `seconds` of sleep inside the compiled step. The sleep is read
    when the step runs, so `layer.seconds = s` changes a traced model's device time without tracing it again."""
    import keras
    import tensorflow as tf

    class DeviceTime(keras.layers.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.seconds = seconds

        def call(self, x):
            def device():
                time.sleep(self.seconds)
                return np.float32(0)

            done = tf.numpy_function(device, [], tf.float32, stateful=True)
            return x + tf.stop_gradient(tf.reshape(done, []))

        def compute_output_shape(self, shape):
            return shape

    return DeviceTime()


def sequences(batches: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batches * BATCH, TIMESTEPS, FEATURES)).astype("float32")
    return x, x[:, :, :1].mean(axis=1)


def stalled_dataset(batches: int, stall_s: float | Callable[[int], float] = 0.0, *, prefetch: str = "injected",
                    seed: int = 0):
    """`batches` batches, each delayed by `stall_s` seconds in Python (`stall_s(i)` for batch i).

    prefetch: "none" (TensorFlow's injected prefetch turned off too), "injected" (TensorFlow's default for a
    pipeline without prefetch) or "explicit" (`.prefetch(2)`).
    """
    import tensorflow as tf

    x, y = sequences(batches, seed)
    delay = stall_s if callable(stall_s) else (lambda _: stall_s)
    counter = {"batch": 0}

    def stall(features):
        seconds = delay(counter["batch"])
        counter["batch"] += 1
        if seconds:
            time.sleep(seconds)
        return features

    def python_stage(features, labels):
        out = tf.py_function(stall, [features], tf.float32)
        out.set_shape(features.shape)
        return out, labels

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).map(python_stage)
    if prefetch == "explicit":
        dataset = dataset.prefetch(2)
    if prefetch == "none":
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        options.autotune.enabled = False
        dataset = dataset.with_options(options)
    return dataset


def pytest_collection_finish(session):
    """Move what collection imported (TensorFlow, Keras, JAX: millions of objects) out of the collector's reach, so
    that a full collection walks only what the tests made (0.3-0.4 s less each). Python 3.11 runs a full collection
    only when the long-lived objects grew by a quarter; with them frozen that rule compares against none, and every
    tenth gen-1 collection would be a full one, which slowed fits timed to the step (the XLA ragged lengths, the
    MirroredStrategy split) past their predictions. A full collection after 1,000 gen-1 ones is as rare as in a
    process with TensorFlow's objects unfrozen."""
    gc.collect()
    gc.freeze()
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, 1000)


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0


@pytest.fixture(autouse=True)
def _collect_what_a_test_left_running():
    """Collect the garbage of a test that left threads running, at its end.

    tf.data iterators a test leaves in reference cycles keep their threads until Python's collector finds them.
    Torn down late, each waited for its threads (the autotuner's among them) inside the collection of whichever
    later test triggered it: pauses of 10-41 s without CPU in one fast loop (docs/testing.md). Collected at the end
    of the test that started them, they go while young, in a fraction of a second. What is still alive then is
    frozen with what collection imported (see `pytest_collection_finish`), so each later collection walks only
    what was made since: 51 of them took 2.2 s in a fast loop, 5.3 s unfrozen. Reference counting still frees a
    frozen object; a frozen cycle that becomes garbage stays until the process ends.
    """
    before = _threads()
    yield
    if _threads() > before:
        gc.collect()
        gc.freeze()


@pytest.fixture(scope="session")
def traced_models():
    """`traced_models(**tiny_model_args)`: a `tiny_model(**tiny_model_args)` whose train function is traced, one per
    set of arguments a session: a fit of it costs about 0.1 s of CPU where a fresh model's first costs 1.3-1.5 s.
    Models with device time share one trace whatever its length (`device_s` is set on the model asked for).
    For tests whose check is not about a fit's first step (its trace) or the model's weights: it trains on in
    every test that asks for the same arguments."""
    models = {}

    def traced(device_s: float = 0.0, **tiny_model_args):
        key = (device_s > 0, *sorted(tiny_model_args.items()))
        if key not in models:
            model = tiny_model(seed=7, device_s=device_s, **tiny_model_args)
            model.fit(stalled_dataset(2 * model.steps_per_execution), epochs=1, verbose=0)
            models[key] = model
        model = models[key]
        if device_s:
            model.layers[-1].seconds = device_s
        return model

    return traced


@pytest.fixture(scope="session")
def traced_model(traced_models):
    """The session's traced `tiny_model()` (see `traced_models`)."""
    return traced_models()


def _idle_every_second(t: float) -> float:
    """A fake GPU's utilization: idle the first third of every second, 90% busy the rest."""
    return 0.0 if t % 1.0 < 0.35 else 90.0


@pytest.fixture(scope="session")
def recorded_runs(tmp_path_factory, traced_model) -> pathlib.Path:
    """Real fits recorded once a session, for the tests that read runs rather than record them.

    Copy the runs a test needs into its own log directory (`shutil.copytree`); never write here. The session's
    `traced_model` makes them all, so no fit here traces its train function (a fresh model costs 1.3-1.5 s of CPU
    for tracing, a fit of a traced one 0.1 s); each fit's first step is still its warm-up phase:
    - `cpu_fit`: without NVML: 30 steps, each batch 20 ms late in a pipeline without prefetch, so input-bound;
    - `short`: 5 more steps of it without NVML, too few for a verdict;
    - `gpu_fit`: 40 steps on a fake GPU that idles a third of every second, each batch 30 ms late;
    - `no_gpm_fit`: 12 steps on a fake GPU without GPM, as every card before Hopper.
    """
    from fake_nvml import FakeGpu, FakeNvmlLib, installed, library_missing

    from rnnmon import UtilizationMonitor

    root = tmp_path_factory.mktemp("recorded")
    model = traced_model
    with library_missing():
        model.fit(stalled_dataset(30, 0.02, prefetch="none"), epochs=1, verbose=0,
                  callbacks=[UtilizationMonitor(str(root / "cpu_fit"))])
        model.fit(stalled_dataset(5), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(root / "short"))])
    with installed(FakeNvmlLib([FakeGpu(utilization=_idle_every_second, pids=[os.getpid()])])):
        model.fit(stalled_dataset(40, 0.03), epochs=1, verbose=0,
                  callbacks=[UtilizationMonitor(str(root / "gpu_fit"), sample_interval_s=0.1)])
    with installed(FakeNvmlLib([FakeGpu(gpm_supported=False, pids=[os.getpid()])])):
        model.fit(stalled_dataset(12, 0.02), epochs=1, verbose=0,
                  callbacks=[UtilizationMonitor(str(root / "no_gpm_fit"), sample_interval_s=0.1)])
    return root


@pytest.fixture
def rnnmon_warnings(caplog):
    """The warnings rnnmon logged during the test."""
    caplog.set_level(logging.WARNING, logger="rnnmon")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "rnnmon" and r.levelno >= logging.WARNING]


@pytest.fixture
def no_nvml():
    """Guarantee NVML's library cannot load (also on a machine with a GPU)."""
    from fake_nvml import library_missing

    with library_missing():
        yield


def read_run(logdir: str, run: str = "rnnmon"):
    from rnnmon.format.reader import open_logdir, read_runs

    provider, ctx = open_logdir(logdir)
    return read_runs(provider, ctx)[run]


def run_status(logdir) -> str | None:
    """The recorded status of the run under `logdir`, or None while nothing has been flushed."""
    try:
        return read_run(str(logdir)).info.get("status")
    except KeyError:
        return None


def bytes_read() -> int:
    """What this process has read through read(2) so far (Linux's /proc/self/io `rchar`)."""
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar:")).split()[1])


@contextlib.contextmanager
def mounted_tmpfs(folder, size: str):
    """A real tmpfs of `size` ("512k", "2m") mounted at the new folder `folder`, unmounted after; the test is
    skipped where one cannot be mounted (mounting needs root and mount(8))."""
    folder.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
