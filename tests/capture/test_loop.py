"""`monitor.loop()`: training loops written by hand (TF GradientTape, JAX jit around stateless_call, torch) make
the run a fit makes: steps, input wait, phases, the verdict, findings and the final status."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TESTS, read_run

import rnnmon
from rnnmon.analysis.summary import summarize

TRUE_WAIT = []  # seconds each generated batch really slept


def generator(batches: int, sleep_s: float, seed: int = 0, timesteps: int = 16):
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        if sleep_s:
            start = time.perf_counter()
            time.sleep(sleep_s)  # a slow Python input pipeline
            TRUE_WAIT.append(time.perf_counter() - start)
        x = rng.normal(size=(32, timesteps, 8)).astype("float32")
        yield x, x[:, :, :1].mean(axis=1)


def tape_loop(logdir: str, batches: int, sleep_s: float, *, fail_at: int | None = None, compiled: bool = True,
              timesteps: int = 16):
    model = keras.Sequential([keras.Input((timesteps, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam()

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    step = tf.function(train_step) if compiled else train_step
    with rnnmon.UtilizationMonitor(logdir).loop(model) as loop:
        for epoch in range(2):
            for index, (x, y) in enumerate(loop.batches(generator(batches, sleep_s, epoch, timesteps))):
                if fail_at is not None and epoch == 1 and index == fail_at:
                    raise RuntimeError("the loss went NaN")
                loss = step(x, y)
                loop.step_done(loss)
            with loop.phase("validation"):
                float(keras.ops.mean(model(np.zeros((32, timesteps, 8), "float32"))))


def test_gradient_tape_loop_fed_by_a_slow_generator_is_input_bound(tmp_path, no_nvml):
    TRUE_WAIT.clear()
    tape_loop(str(tmp_path), batches=20, sleep_s=0.01)
    summary = summarize(read_run(str(tmp_path)))
    assert summary["status"] == "finished" and summary["steps"] == 40, summary["summary"]
    assert summary["verdict"] == "input-bound", summary["summary"]
    true_ms = float(np.median(TRUE_WAIT)) * 1e3
    assert abs(summary["input_wait_ms"]["median"] - true_ms) <= 0.25 * true_ms, (summary["input_wait_ms"], true_ms)
    assert summary["eval_fraction"] > 0 and summary["input_kind"] == "generator"
    codes = [f["code"] for f in summary["findings"]]  # a new generator each epoch is audited, named once
    assert codes.count("DATA_NOT_TF") == 1 and "INPUT_BOUND" in codes and "EAGER_STEP" not in codes, codes
    assert summary["eager_probe"]["ops"] <= 1


@pytest.mark.slow
def test_gradient_tape_step_without_tf_function_is_named_eager_with_its_python_share(tmp_path, no_nvml):
    tape_loop(str(tmp_path), batches=7, sleep_s=0.0, compiled=False, timesteps=4)
    summary = summarize(read_run(str(tmp_path)))
    [eager] = [f for f in summary["findings"] if f["code"] == "EAGER_STEP"]
    assert summary["eager_probe"]["ops"] >= 100 and summary["eager_probe"]["framework"] == "tensorflow"
    assert "tf.function" in eager["advice"] and eager["speedup"] > 1.1, eager
    assert summary["verdict"] != "input-bound"


@pytest.mark.slow
def test_gradient_tape_loop_without_the_sleep_is_not_input_bound(tmp_path, no_nvml):
    tape_loop(str(tmp_path), batches=30, sleep_s=0.0)
    summary = summarize(read_run(str(tmp_path)))
    assert summary["status"] == "finished" and summary["steps"] == 60
    assert summary["verdict"] != "input-bound", summary["summary"]


@pytest.mark.slow
def test_an_exception_mid_loop_ends_the_run_failed_with_its_steps_written(tmp_path, no_nvml):
    with pytest.raises(RuntimeError, match="went NaN"):
        tape_loop(str(tmp_path), batches=10, sleep_s=0.0, fail_at=4)
    summary = summarize(read_run(str(tmp_path)))
    assert summary["status"] == "failed" and summary["steps"] == 14  # the 15th step raised before it ran


def test_a_loop_whose_log_dir_cannot_be_written_trains_unmonitored_with_one_error(tmp_path, no_nvml, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    seen = []
    with rnnmon.UtilizationMonitor(str(blocker / "runs")).loop() as loop:
        for batch in loop.batches(range(5)):
            seen.append(batch)
            loop.step_done()
        with loop.phase("validation"):
            seen.append("validation")
    assert seen == [0, 1, 2, 3, 4, "validation"]
    assert next(r.message for r in caplog.records if r.levelname == "ERROR").startswith(
        "rnnmon: monitoring is off for this loop")


def test_loop_api_is_refused_outside_its_with_block_and_for_an_unknown_phase(tmp_path, no_nvml):
    loop = rnnmon.UtilizationMonitor(str(tmp_path)).loop()
    with pytest.raises(RuntimeError, match=r"inside `with monitor\.loop"):
        next(loop.batches([1]))
    with loop, pytest.raises(ValueError, match="Received: name='test'"), loop.phase("test"):
        pass


@pytest.mark.slow
def test_a_tf_data_loop_is_audited_alerted_exported_and_stopped_as_a_fit_is(tmp_path, no_nvml):
    parser = pytest.importorskip("prometheus_client.parser")

    def slow(x):  # a Python stage, 10 ms a batch, in a serial map with no prefetch
        time.sleep(0.01)
        return x

    x = np.random.default_rng(0).normal(size=(32 * 400, 16, 8)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :, :1].mean(axis=1))).batch(32).map(
        lambda a, b: (tf.numpy_function(slow, [a], tf.float32), b))
    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((model(x, training=True) - y) ** 2)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    monitor = rnnmon.UtilizationMonitor(str(tmp_path), prometheus_port=0, stop_on_alert=["input_wait_high"],
                                        thresholds={"input_wait_high": {"for_s": 1.0}}, flush_secs=0.5)
    with monitor.loop(model) as loop:
        for x_batch, y_batch in loop.batches(data):
            loop.step_done(train_step(x_batch, y_batch))
        assert loop.stop_requested  # the alert ended the epoch long before its 400 batches
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor.prometheus_port}/metrics", timeout=5) as answer:
        steps = [s.value for family in parser.text_string_to_metric_families(answer.read().decode())
                 for s in family.samples if s.name == "rnnmon_steps_total"]
    summary = summarize(read_run(str(tmp_path)))
    assert summary["status"] == "finished" and 10 < summary["steps"] < 400, summary["steps"]
    assert steps == [summary["steps"]]
    assert [a["rule"] for a in summary["alerts"]] == ["input_wait_high"]
    codes = {f["code"] for f in summary["findings"]}
    assert {"PIPELINE_SERIAL_MAP", "PIPELINE_PY_FUNCTION", "INPUT_BOUND"} <= codes, codes
    assert summary["input_kind"] == "tf.data" and summary["fetch_floor_ms"] > 0


BACKEND_LOOP = textwrap.dedent("""
    import sys, time
    import numpy as np, keras, rnnmon

    SLEEP_S = {sleep_s}
    TRUE_WAIT = []

    def batches(count, seed):
        rng = np.random.default_rng(seed)
        for _ in range(count):
            if SLEEP_S:
                start = time.perf_counter(); time.sleep(SLEEP_S); TRUE_WAIT.append(time.perf_counter() - start)
            x = rng.normal(size=(32, 16, 8)).astype("float32")
            yield x, x[:, :, :1].mean(axis=1)

    model = keras.Sequential([keras.Input((16, 8)), {layer}, keras.layers.Dense(1)])
    monitor = rnnmon.UtilizationMonitor({logdir!r})
    {loop}
    print("TRUE_WAIT_MS", 1e3 * float(np.median(TRUE_WAIT)) if TRUE_WAIT else 0.0)
""")

JAX_LOOP = """
import jax
optimizer = keras.optimizers.Adam()
optimizer.build(model.trainable_variables)

def loss_fn(trainable, non_trainable, x, y):
    out, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
    return keras.ops.mean((out - y) ** 2), non_trainable

grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

@jax.jit
def train_step(state, x, y):
    trainable, non_trainable, opt_vars = state
    (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
    trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
    return loss, (trainable, non_trainable, opt_vars)

state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
         [v.value for v in optimizer.variables])
with monitor.loop(model) as loop:
    for epoch in range(2):
        for x, y in loop.batches(batches({batches}, epoch)):
            loss, state = train_step(state, x, y)
            loop.step_done(loss)
        with loop.phase("validation"):
            float(keras.ops.mean(model(np.zeros((256, 16, 8), "float32"))))
"""

TORCH_LOOP = """
import torch

class Batches(torch.utils.data.IterableDataset):  # read in the training loop: num_workers=0
    def __init__(self, count, seed):
        self.count, self.seed = count, seed

    def __iter__(self):
        return batches(self.count, self.seed)

optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
with monitor.loop(model) as loop:
    for epoch in range(2):
        for x, y in loop.batches(torch.utils.data.DataLoader(Batches({batches}, epoch), batch_size=None)):
            optimizer.zero_grad()
            loss = torch.mean((model(x) - y) ** 2)
            loss.backward()
            optimizer.step()
            loop.step_done(loss)
        with loop.phase("validation"):
            with torch.no_grad():
                float(keras.ops.mean(model(np.zeros((256, 16, 8), "float32"))))
"""


def run_backend_loop(tmp_path, backend: str, loop: str, batches: int, sleep_s: float,
                     layer: str = "keras.layers.LSTM(16)") -> tuple[dict, float]:
    """The loop in a process of its own on `backend`: (its run's summary, the generator's true median wait)."""
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    script = BACKEND_LOOP.format(sleep_s=sleep_s, logdir=str(tmp_path), layer=layer,
                                 loop=loop.format(batches=batches))
    env = {**os.environ, "KERAS_BACKEND": backend}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    true_ms = float(result.stdout.split("TRUE_WAIT_MS")[1].split()[0])
    summary = summarize(read_run(str(tmp_path)))
    assert summary["backend"] == backend and summary["status"] == "finished"
    assert summary["steps"] == 2 * batches and summary["eval_fraction"] > 0, summary["summary"]
    return summary, true_ms


@pytest.mark.slow
@pytest.mark.parametrize("backend, loop, sleep_s", [("jax", JAX_LOOP, 0.01), ("torch", TORCH_LOOP, 0.2)],
                         ids=["jax", "torch"])  # torch: Keras's LSTM is a Python loop there, 50-160 ms a step
def test_loop_fed_by_a_slow_generator_is_input_bound(tmp_path, backend, loop, sleep_s):
    summary, true_ms = run_backend_loop(tmp_path, backend, loop, batches=12, sleep_s=sleep_s)
    assert summary["verdict"] == "input-bound", summary["summary"]
    codes = {f["code"] for f in summary["findings"]}  # the input given to batches() is audited, as fit's is
    assert ("DATALOADER_NO_WORKERS" if backend == "torch" else "DATA_NOT_TF") in codes, codes
    assert abs(summary["input_wait_ms"]["median"] - true_ms) <= 0.25 * true_ms, (summary["input_wait_ms"], true_ms)


@pytest.mark.slow
@pytest.mark.parametrize("backend, loop", [("jax", JAX_LOOP), ("torch", TORCH_LOOP)], ids=["jax", "torch"])
def test_loop_without_the_sleep_is_not_input_bound(tmp_path, backend, loop):
    summary, _ = run_backend_loop(tmp_path, backend, loop, batches=30, sleep_s=0.0)
    assert summary["verdict"] != "input-bound", summary["summary"]


@pytest.mark.slow
def test_jax_step_without_jit_is_named_eager(tmp_path):
    loop = JAX_LOOP.replace("@jax.jit\n", "")
    summary, _ = run_backend_loop(tmp_path, "jax", loop, batches=6, sleep_s=0.0,
                                  layer="keras.layers.Flatten(), keras.layers.Dense(16)")  # (an eager LSTM: 6 s)
    [eager] = [f for f in summary["findings"] if f["code"] == "EAGER_STEP"]
    assert summary["eager_probe"]["ops"] >= 20 and "jax.jit" in eager["advice"], eager


@pytest.mark.slow
def test_jitted_jax_step_dispatches_no_op_from_python(tmp_path):
    summary, _ = run_backend_loop(tmp_path, "jax", JAX_LOOP, batches=6, sleep_s=0.0,
                                  layer="keras.layers.Flatten(), keras.layers.Dense(16)")
    assert summary["eager_probe"]["ops"] == 0
    assert "EAGER_STEP" not in {f["code"] for f in summary["findings"]}


JAX_WORKER = textwrap.dedent("""
    import sys, time
    import jax, keras, numpy as np
    import rnnmon

    log_dir, index, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    monitor = rnnmon.UtilizationMonitor(log_dir)  # built before initialize(), as users write it
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=index)

    def batches(count):
        rng = np.random.default_rng(index)
        for _ in range(count):
            time.sleep(0.01 * index)  # process 1 waits 10 ms a batch for its input
            yield rng.normal(size=(32, 8)).astype("float32")

    @jax.jit
    def train_step(w, x):
        loss, grad = jax.value_and_grad(lambda w: ((x @ w) ** 2).mean())(w)
        return loss, w - 0.01 * grad

    w = np.ones((8, 1), "float32")
    with monitor.loop() as loop:
        for x in loop.batches(batches(24)):
            loss, w = train_step(w, x)
            loop.step_done(loss)
""")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_two_jax_processes_write_a_worker_folder_each(tmp_path):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    _two_workers(tmp_path, [([JAX_WORKER, str(tmp_path), str(i), str(port)], env) for i in (0, 1)], steps=24)


def _two_workers(tmp_path, processes: list[tuple[list[str], dict]], steps: int) -> None:
    """Run the two processes (`python -c` argv, environment) together: each writes its worker folder with `steps`
    steps, and worker-1, whose input takes 10 ms a batch, waits for it where worker-0 does not."""
    workers = [subprocess.Popen([sys.executable, "-c", *argv], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for argv, env in processes]
    try:
        errors = [worker.communicate(timeout=300)[1] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [w.returncode for w in workers] == [0, 0], [e[-2000:] for e in errors]
    assert sorted(os.listdir(tmp_path)) == ["worker-0", "worker-1"]
    runs = {name: summarize(read_run(str(tmp_path / name))) for name in ("worker-0", "worker-1")}
    assert all(s["status"] == "finished" and s["steps"] == steps for s in runs.values()), runs
    assert runs["worker-1"]["input_wait_ms"]["median"] > 8 > runs["worker-0"]["input_wait_ms"]["median"]


DEVICE_STEP = """
import jax

def device():  # ~30 ms a step inside the compiled step, as a device computes after the call has returned
    time.sleep(0.03)
    return np.float32(0)

@jax.jit
def train_step(w, x):
    loss, grad = jax.value_and_grad(lambda w: ((x.reshape(32, -1) @ w) ** 2).mean())(w)
    loss = loss + jax.lax.stop_gradient(jax.pure_callback(device, jax.ShapeDtypeStruct((), np.float32)))
    return loss, w - 0.01 * grad

w = np.ones((128, 1), "float32")
with monitor.loop() as loop:
    for epoch in range(2):
        for x, y in loop.batches(batches({batches}, epoch)):
            loss, w = train_step(w, x)
            {done}
        with loop.phase("validation"):
            float(loss)
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_step_done_ends_a_jax_step_when_the_device_has_finished_it(tmp_path):
    # JAX may return from the call before the device's 30 ms are done; with step_done(loss) they are the step's,
    # and the next fetch (30 ms of sleep) is input wait only: half of each step, not all of it.
    loop = DEVICE_STEP.replace("{done}", "loop.step_done(loss)")
    summary, true_ms = run_backend_loop(tmp_path, "jax", loop, batches=12, sleep_s=0.03)
    assert summary["step_ms"]["median"] > 55, summary["step_ms"]
    assert abs(summary["input_wait_ms"]["median"] - true_ms) <= 0.25 * true_ms
    assert 0.35 < summary["shares"]["input"] < 0.65 and summary["verdict"] == "input-bound", summary["summary"]


@pytest.mark.slow
@pytest.mark.parametrize("backend, loop", [("jax", JAX_LOOP), ("torch", TORCH_LOOP)], ids=["jax", "torch"])
def test_an_exception_mid_loop_ends_the_run_failed_on_other_backends(tmp_path, backend, loop):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    [line] = [line for line in loop.splitlines() if "for x, y in loop.batches(" in line]
    failing = loop.replace(line, line.replace("for x, y in loop.batches(", "for index, (x, y) in enumerate("
                                              "loop.batches(").removesuffix(":") + "):\n"
                           "            if epoch == 1 and index == 4:\n"
                           "                raise RuntimeError('the loss went NaN')")
    script = BACKEND_LOOP.format(sleep_s=0.0, logdir=str(tmp_path), layer="keras.layers.LSTM(8)",
                                 loop=failing.format(batches=8))
    result = subprocess.run([sys.executable, "-c", script], env={**os.environ, "KERAS_BACKEND": backend},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "the loss went NaN" in result.stderr, result.stderr[-2000:]
    summary = summarize(read_run(str(tmp_path)))
    assert summary["status"] == "failed" and summary["steps"] == 12, (summary["status"], summary["steps"])


TORCH_GLOO = """
import torch.distributed
torch.distributed.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR/PORT
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_two_processes_of_a_loop_write_a_worker_folder_each(tmp_path, backend):
    """TF_CONFIG's task (TensorFlow) and torchrun's RANK (torch, with a gloo group) name each process's folder, as
    they do for a fit; process 1 waits 10 ms a batch for its input and its run says so."""
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]}
    processes = []
    for index in (0, 1):
        script = BACKEND_LOOP.format(sleep_s=0.01 * index, logdir=str(tmp_path), layer="keras.layers.LSTM(8)",
                                     loop=(TORCH_GLOO + TORCH_LOOP).format(batches=10)) if backend == "torch" else (
            f"import sys; sys.path[:0] = [{TESTS!r}, {os.path.dirname(__file__)!r}]\n"
            f"from test_loop import tape_loop\ntape_loop({str(tmp_path)!r}, 10, {0.01 * index})")
        env = {**os.environ, "KERAS_BACKEND": backend, "RANK": str(index), "LOCAL_RANK": str(index),
               "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)} if backend == "torch" else {
               **os.environ, "KERAS_BACKEND": backend,
               "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        processes.append(([script], env))
    _two_workers(tmp_path, processes, steps=20)
