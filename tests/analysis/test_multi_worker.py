"""Several workers: two real worker processes on localhost (CPU, TF_CONFIG), one with a stalled input pipeline.

Keras 3 cannot fit under `MultiWorkerMirroredStrategy` (keras-team/keras#20585: the fit fails on a PerReplica
value, with or without rnnmon), so the workers synchronise as an all-reduce would: inside the compiled step,
each waits for the other over a socket. The fast worker then spends its step waiting for the slow one.
A real 2-process JAX job (`jax.distributed.initialize`, gloo collectives on CPU, `DataParallel`) and two torchrun
ranks (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`) check how a worker is named, from the environment or at the fit's start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import TESTS
from jax_job import JOB

from rnnmon.analysis.stragglers import compare_workers
from rnnmon.findings import amdahl
from rnnmon.format.logdir import read_logdir
from rnnmon.report import build_report, render_text

WORKER = textwrap.dedent("""
    import socket, sys, time
    import tensorflow as tf
    sys.path.insert(0, sys.argv[2])
    import keras, rnnmon
    from conftest import stalled_dataset

    index, port = int(sys.argv[3]), int(sys.argv[5])
    if index == 0:
        server = socket.create_server(("127.0.0.1", port))
        server.settimeout(120)
        peer = server.accept()[0]
    else:
        deadline = time.time() + 120
        while True:
            try:
                peer = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
    peer.settimeout(120)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one byte each way per step, without delay

    def all_reduce(value):  # both workers leave only when both have arrived, as at a collective
        peer.sendall(b"s")
        assert peer.recv(1) == b"s"
        return value

    class Synchronise(keras.layers.Layer):
        def call(self, x):
            done = tf.numpy_function(all_reduce, [tf.constant(0.0)], tf.float32, stateful=True)
            return x + tf.stop_gradient(tf.reshape(done, []))

        def compute_output_shape(self, shape):
            return shape

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1), Synchronise()])
    model.compile(optimizer="adam", loss="mse")
    data = stalled_dataset(40, float(sys.argv[4]), prefetch="none")
    model.fit(data, epochs=1, verbose=0, callbacks=[rnnmon.UtilizationMonitor(sys.argv[1], audit=False)])
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_workers_write_two_runs_and_the_stalled_one_is_the_straggler(tmp_path):
    tests = TESTS
    cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    barrier_port, stall_s = free_port(), {0: 0.0, 1: 0.02}
    workers = []
    for index in (0, 1):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        workers.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path), tests, str(index), str(stall_s[index]), str(barrier_port)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        errors = [worker.communicate(timeout=240)[1] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [w.returncode for w in workers] == [0, 0], [e[-2000:] for e in errors]
    assert sorted(os.listdir(tmp_path)) == ["worker-0", "worker-1"]

    report = build_report(str(tmp_path))
    assert sorted(run["run"] for run in report["runs"]) == ["worker-0/rnnmon", "worker-1/rnnmon"]
    (group,) = report["workers"]
    by_name = {w["worker"]: w for w in group["workers"]}
    assert by_name["worker-1"]["input_wait_ms"] > by_name["worker-0"]["input_wait_ms"] + 10, by_name
    (straggler,) = group["findings"]
    assert straggler["code"] == "STRAGGLER" and straggler["where"] == "worker-1", straggler
    assert "Cause: input wait" in straggler["message"] and "the whole job waits at least" in straggler["message"]
    # The bound: the job's step (the other worker's, which waits for worker-1) without worker-1's extra stall.
    excess = sum(by_name["worker-1"][k] - by_name["worker-0"][k] for k in ("input_wait_ms", "host_gap_ms"))
    assert straggler["speedup"] == amdahl(excess / by_name["worker-0"]["step_ms"]) > 1.3, (straggler, by_name)
    assert f"up to {straggler['speedup']:.2f}x shorter steps" in straggler["message"]
    text = render_text(report)
    assert "Workers of . (2)" in text and "STRAGGLER at worker-1" in text, text




def _run_workers(argvs: list[list[str]], envs: list[dict[str, str]]) -> list[str]:
    """Start the processes together and wait for all of them; their stderr."""
    workers = [subprocess.Popen([sys.executable, "-c", *argv], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for argv, env in zip(argvs, envs)]
    try:
        errors = [worker.communicate(timeout=300)[1] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [w.returncode for w in workers] == [0] * len(workers), [e[-2000:] for e in errors]
    return errors


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_a_jax_job_monitored_from_before_distributed_initialize_names_a_15ms_straggler(tmp_path):
    # Building the monitor asked jax.process_count(), which started JAX's backend: initialize() then raised
    # "must be called before any JAX calls". And a 15 ms stall a batch on a ~90 ms step (17% of the job, paid by
    # both workers every step) stayed under the old bar, 20% of the others' step, which holds their wait for it.
    # (It was 12 ms: on a machine loaded enough to stretch the step past 240 ms that fell under the 5% bar; 15 ms
    # holds up to 300 ms.)
    port, stall_s = free_port(), {0: 0.0, 1: 0.015}
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    _run_workers([[JOB, str(tmp_path), str(i), str(port), str(stall_s[i]), "30", "{}"] for i in (0, 1)], [env, env])
    assert sorted(os.listdir(tmp_path)) == ["worker-0", "worker-1"]

    report = build_report(str(tmp_path))
    (group,) = report["workers"]
    by_name = {w["worker"]: w for w in group["workers"]}
    excess = sum(by_name["worker-1"][k] - by_name["worker-0"][k] for k in ("input_wait_ms", "host_gap_ms"))
    step = by_name["worker-0"]["step_ms"]
    assert 11 < excess < 23 and step > 50, by_name  # the injected stall, on a step that is otherwise much longer
    (straggler,) = group["findings"]
    assert straggler["code"] == "STRAGGLER" and straggler["where"] == "worker-1", (straggler, by_name)
    assert f"the whole job waits at least {excess:.2f} ms a step for it" in straggler["message"], straggler
    assert f"of the job's median {step:.2f} ms step. Cause: input wait." in straggler["message"]
    assert straggler["speedup"] == amdahl(excess / step)


TORCH_RANK = textwrap.dedent("""
    import sys, time
    import keras, numpy as np
    import rnnmon

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            time.sleep(0.02)
            rng = np.random.default_rng(i)
            return rng.normal(size=(16, 16, 8)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")

    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(Batches(), epochs=1, verbose=0, callbacks=[rnnmon.UtilizationMonitor(sys.argv[1], audit=False)])
""")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torchrun_ranks_write_a_worker_folder_each(tmp_path):
    # torchrun's ranks were one process to rnnmon: both wrote <log_dir>/rnnmon, and the second was refused as
    # "another monitor".
    envs = [dict(os.environ, KERAS_BACKEND="torch", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                 LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500") for rank in (0, 1)]
    errors = _run_workers([[TORCH_RANK, str(tmp_path)]] * 2, envs)
    assert not any("another monitor" in error for error in errors), errors
    assert sorted(os.listdir(tmp_path)) == ["worker-0", "worker-1"]
    runs = read_logdir(str(tmp_path))
    assert sorted(runs) == ["worker-0/rnnmon", "worker-1/rnnmon"]
    for name, run in runs.items():
        assert run.info["status"] == "finished" and run.info["worker"] == name.split("/")[0] and len(run.steps) >= 19


def test_worker_names_from_torchrun_ranks(caplog):
    from rnnmon.capture.workers import worker_name

    assert worker_name({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) == "worker-3"
    assert worker_name({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}) == "worker-0"
    assert worker_name({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: no worker folder
    assert worker_name({"RANK": "0"}) is None and caplog.records == []
    tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}})
    assert worker_name({"TF_CONFIG": tf_config, "RANK": "0", "WORLD_SIZE": "2"}) == "worker-1"  # TF_CONFIG first
    for rank, world in (("-1", "2"), ("2", "2"), ("../x", "2"), ("1000000", "2000000")):
        caplog.clear()
        assert worker_name({"RANK": rank, "WORLD_SIZE": world}) is None
        (error,) = [r.getMessage() for r in caplog.records if r.name == "rnnmon"]
        assert "cannot name a worker's folder" in error


def test_worker_names_from_tf_config():
    from rnnmon.capture.workers import worker_name

    def config(task):
        return {"TF_CONFIG": json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": task})}

    assert worker_name(config({"type": "worker", "index": 1})) == "worker-1"
    assert worker_name(config({"type": "chief", "index": 0})) == "chief-0"  # not worker-0: that one exists too
    assert worker_name({"TF_CONFIG": "{not json"}) is None
    assert worker_name({}) is None
    assert worker_name(config({"type": "ps", "index": "2"})) == "ps-2"  # an index written as a string


@pytest.mark.parametrize(("kind", "index"), [("../../x", 0), ("/tmp/abs", 0), ('q"uote\nline', 1), ("worker/..", 0),
                                             ("worker", -1), ("worker", "1/../.."), ("worker", 10**6), (["worker"], 0)])
def test_a_task_that_cannot_name_a_folder_is_refused_with_one_error(kind, index, caplog):
    from rnnmon.capture.workers import worker_name

    assert worker_name({"TF_CONFIG": json.dumps({"cluster": {}, "task": {"type": kind, "index": index}})}) is None
    (error,) = [r.getMessage() for r in caplog.records if r.name == "rnnmon"]
    assert "cannot name a worker's folder" in error and "\n" not in error  # one line, the type escaped


HOSTILE_FITS = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    from conftest import stalled_dataset, tiny_model
    from fake_nvml import library_missing
    from rnnmon import UtilizationMonitor

    with library_missing():
        for kind, log_dir in {cases!r}:
            os.environ["TF_CONFIG"] = json.dumps({{"cluster": {{}}, "task": {{"type": kind, "index": 0}}}})
            tiny_model().fit(stalled_dataset(6), epochs=1, verbose=0,
                             callbacks=[UtilizationMonitor(log_dir, audit=False)])
""")


@pytest.mark.slow
def test_a_hostile_tf_config_task_type_writes_nothing_outside_the_log_dir(tmp_path):
    # The task type went unchecked into the run folder's path: `../../x` and an absolute path wrote outside
    # log_dir, and quotes and newlines ended up in folder names.
    kinds = ["../../escaped", str(tmp_path / "absolute"), 'quote"and\nnewline']
    cases = [(kind, str(tmp_path / f"job{i}" / "logs")) for i, kind in enumerate(kinds)]
    child = subprocess.run([sys.executable, "-c", HOSTILE_FITS.format(tests=TESTS, cases=cases)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    written = sorted(os.path.relpath(os.path.join(folder, name), tmp_path)
                     for folder, _, names in os.walk(tmp_path) for name in names)
    assert written and all(path.startswith(tuple(f"job{i}/logs/rnnmon/" for i in range(3))) for path in written), \
        written
    for _, log_dir in cases:  # each fit recorded, as a single process
        run = read_logdir(log_dir)["rnnmon"]
        assert run.errors == [] and run.info["status"] == "finished" and len(run.steps) >= 4
        assert run.info["worker"] is None
    refused = [line for line in child.stderr.splitlines() if "cannot name a worker's folder" in line]
    assert len(refused) == 3, child.stderr[-3000:]


def test_an_unreadable_tf_config_is_reported_once_per_process(tmp_path, rnnmon_warnings, monkeypatch):
    from rnnmon import UtilizationMonitor

    monkeypatch.setenv("TF_CONFIG", f"{{not json, {tmp_path}")  # a value no other test used
    monitors = [UtilizationMonitor(str(tmp_path)) for _ in range(3)]  # as a KerasTuner search's copies
    assert [m.worker for m in monitors] == [None] * 3
    assert sum("TF_CONFIG is not readable" in w for w in rnnmon_warnings()) == 1


@pytest.mark.slow
def test_tab_route_compares_the_workers_of_a_job(tmp_path, monkeypatch):
    from conftest import stalled_dataset, tiny_model
    from served_plugin import served_plugin

    from rnnmon import UtilizationMonitor

    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    for index, stall_s in ((0, 0.0), (1, 0.02)):  # two workers of one job, written here one after the other
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        tiny_model().fit(stalled_dataset(30, stall_s, prefetch="none"), epochs=1, verbose=0,
                         callbacks=[UtilizationMonitor(str(tmp_path / "job"), audit=False)])
    _, client = served_plugin(str(tmp_path))

    answer = client.get("/data/plugin/rnnmon/workers", query_string={"run": "job/worker-0/rnnmon"}).get_json()
    assert answer["job"] == "job"
    assert [w["worker"] for w in answer["workers"]] == ["worker-1", "worker-0"]  # the straggler first
    assert [(f["code"], f["where"]) for f in answer["findings"]] == [("STRAGGLER", "worker-1")]
    other = client.get("/data/plugin/rnnmon/workers", query_string={"run": "elsewhere/rnnmon"}).get_json()
    assert other == {"job": None, "workers": [], "findings": [], "left_out": [], "heatmap": None}


def _worker(name, step_ms, wait_ms, gpu_idle):
    """A worker's `worker_figures`."""
    return {"run": f"job/{name}/rnnmon", "judged": True, "steps": 100, "wall_s": 1.0, "step_ms": step_ms,
            "input_wait_ms": wait_ms, "host_gap_fraction": 0.0, "gpu_idle_fractions": [gpu_idle]}


def test_a_compute_straggler_bound_is_the_time_the_others_idle_for_it():
    (group,) = compare_workers([_worker("worker-0", 10.0, 0.5, 0.45), _worker("worker-1", 10.0, 0.5, 0.05)])
    (straggler,) = group["findings"]
    assert straggler["where"] == "worker-1" and "Cause: compute" in straggler["message"]
    assert straggler["speedup"] == 1.67  # the others idle 40% of their 10 ms step waiting: 1 / (1 - 0.4)
    assert "up to 1.67x shorter steps" in straggler["message"]


def _job(tmp_path, straggler_wait_s: float, step_s: float) -> dict:
    """Three workers of one job (a step 90% of `step_s`, a host gap 10%); worker-1's input waits longer."""
    from synthetic_runs import write_gpu_run

    for index in range(3):
        write_gpu_run(str(tmp_path / "job" / f"worker-{index}" / "rnnmon"), chunks=12, step_s=step_s,
                      wait_s=straggler_wait_s if index == 1 else 0.002)
    (group,) = build_report(str(tmp_path))["workers"]
    return group


@pytest.mark.parametrize(("wait_s", "step_s", "fires"), [(0.0055, 0.1, False), (0.0075, 0.1, True),
                                                         (0.022, 0.134, True)])
def test_a_straggler_fires_at_5_percent_of_the_jobs_step(tmp_path, wait_s, step_s, fires):
    # The bar was 20% of the others' median step, which holds their wait for the straggler: a 20 ms stall that
    # stretched the job's step to 120 ms (17%) stayed silent, as did a 6% one.
    group = _job(tmp_path, wait_s, step_s)
    by_name = {w["worker"]: w for w in group["workers"]}
    step = by_name["worker-0"]["step_ms"]
    excess = by_name["worker-1"]["input_wait_ms"] - by_name["worker-0"]["input_wait_ms"]
    assert (excess / step > 0.05) == fires and abs(excess / step - 0.05) > 0.005, (excess, step)  # off the bar
    assert [(f["code"], f["where"]) for f in group["findings"]] == ([("STRAGGLER", "worker-1")] if fires else [])
    if fires:
        (finding,) = group["findings"]
        assert (f"spends a median {by_name['worker-1']['input_wait_ms']:.2f} ms of each step on input wait against "
                f"{by_name['worker-0']['input_wait_ms']:.2f} ms") in finding["message"]
        assert f"the whole job waits at least {excess:.2f} ms a step for it: {100 * excess / step:.0f}% of the " \
               f"job's median {step:.2f} ms step" in finding["message"], finding["message"]
        assert "about" not in finding["message"]  # a measured time, not an estimate
        assert finding["speedup"] == amdahl(excess / step)


def test_a_stalled_worker_that_also_computes_longer_is_charged_both():
    rows = [_worker("worker-0", 50.0, 0.5, 0.40), _worker("worker-1", 50.0, 3.5, 0.30),
            _worker("worker-2", 50.0, 0.5, 0.40)]
    (group,) = compare_workers(rows)
    (straggler,) = group["findings"]
    assert straggler["where"] == "worker-1" and "Cause: compute" in straggler["message"]
    # 3 ms of stall beyond the others' (6% of the step) and 10% less GPU idle: 5 ms a step of longer compute.
    assert "the whole job waits at least 8.00 ms a step for it, of which 5.00 ms is its longer compute, beyond " \
           "its stall: 16% of the job's median 50.00 ms step" in straggler["message"], straggler["message"]
    assert straggler["speedup"] == amdahl(8.0 / 50.0)


def test_workers_level_within_5_percent_raise_nothing():
    rows = [_worker("worker-0", 50.0, 0.5, 0.40), _worker("worker-1", 50.0, 2.9, 0.37),
            _worker("worker-2", 50.0, 0.6, 0.41)]
    assert compare_workers(rows)[0]["findings"] == []  # 2.4 ms (4.8%) of stall, 4% idle: GPU sampling noise


def test_worker_indexes_are_ascii_digits_without_leading_zeros(caplog):
    """Python's `\\d` matches any Unicode digit: `worker-١٢`, `worker-１２` and `worker-000001` were compared as workers
    12, 12 and 1 (beside the real `worker-12` and `worker-1`)."""
    from rnnmon.analysis.stragglers import worker_of
    from rnnmon.capture.workers import worker_name

    for name in ("worker-١٢", "worker-１２", "worker-000001", "worker-01", "process-٣"):
        assert worker_of(f"job/{name}/rnnmon") is None, name
    for name in ("worker-0", "worker-12", "chief-999999", "process-3"):
        assert worker_of(f"job/{name}/rnnmon") == ("job", name)
    assert worker_name({"RANK": "١٢", "WORLD_SIZE": "20"}) is None
    (error,) = [r.getMessage() for r in caplog.records if r.name == "rnnmon"]
    assert "cannot name a worker's folder" in error


def _calls(function, *args) -> int:
    """How many Python function calls `function(*args)` makes (a count, not a time)."""
    count = 0

    def seen(frame, event, arg):
        nonlocal count
        count += event == "call"

    sys.setprofile(seen)
    try:
        function(*args)
    finally:
        sys.setprofile(None)
    return count


def test_comparing_workers_costs_in_proportion_to_their_number():
    """The straggler search took each worker's stall against the median of all the others, sorting the rest once
    per worker: 2,000 workers made 4 million calls (5 s of the tab's first /workers)."""
    def job(n: int) -> list[dict]:
        return [_worker(f"worker-{i}", 50.0 + i % 7, 0.5 + 5 * (i == 3), 0.40) for i in range(n)]

    small, large = _calls(compare_workers, job(200)), _calls(compare_workers, job(2000))
    assert large < 12 * small, (small, large)  # 10x the workers: about 10x the calls, not 100x
    assert compare_workers(job(2000))[0]["findings"][0]["where"] == "worker-3"
