"""The tab reads a remote log directory (`s3://`, `gs://`) through its on-disk mirror: a real `tensorboard` process
with `--logdir s3://…` / `gs://…`, against a real S3- or GCS-compatible server on 127.0.0.1 (tests/object_stores.py).
A run added to the bucket later appears after the next sync; the secret key in the environment is in no answer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from object_stores import SECRET, TOKEN, ObjectStore
from served_plugin import ROUTE
from synthetic_runs import write_gpu_run


def _get(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            body = response.read().decode()
            return response.status, json.loads(body) if body.startswith(("{", "[")) else body
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _runs_when(route: str, server: subprocess.Popen, wanted: set[str], timeout_s: float = 120) -> dict:
    deadline, runs = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        assert server.poll() is None, "TensorBoard ended"
        try:
            status, body = _get(route + "runs")
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)
            continue  # not up yet
        assert status == 200, body
        runs = {run["run"]: run for run in body["runs"]}
        if wanted <= set(runs):
            return runs
        time.sleep(0.5)
    raise AssertionError(f"runs {sorted(runs)}, wanted {sorted(wanted)}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_the_tab_reads_a_remote_log_directory_through_its_mirror(kind, tmp_path):
    local = tmp_path / "local"
    write_gpu_run(str(local / "exp1" / "rnnmon"), 5)
    with ObjectStore(kind) as store:
        env = dict(os.environ, **store.env, RNNMON_CACHE_DIR=str(tmp_path / "cache"), RNNMON_SYNC_S="1")
        if kind == "s3":
            env.update(AWS_SECRET_ACCESS_KEY=SECRET, AWS_SESSION_TOKEN=TOKEN)
        os.environ.update(store.env)
        try:
            store.make_bucket()
            fs, root = store.filesystem(), store.url("runs").split("://", 1)[1]
            fs.put(str(local) + "/", root, recursive=True)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", store.url("runs"),
                                       "--port", str(port), "--host", "127.0.0.1", "--load_fast=false"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            route = f"http://127.0.0.1:{port}{ROUTE}"
            try:
                runs = _runs_when(route, server, {"exp1/rnnmon"})
                assert runs["exp1/rnnmon"]["errors"] == [] and runs["exp1/rnnmon"]["status"] == "finished"
                status, summary = _get(route + "summary?run=exp1/rnnmon")
                assert status == 200 and summary["steps"] == 25, summary
                write_gpu_run(str(local / "exp2" / "rnnmon"), 3)  # a run that reaches the bucket later
                fs.put(str(local / "exp2") + "/", f"{root}/exp2", recursive=True)
                runs = _runs_when(route, server, {"exp1/rnnmon", "exp2/rnnmon"})
                answers = [runs, summary, *(_get(route + path)[1] for path in
                                            ("summary?run=exp2/rnnmon", "timeline?run=exp1/rnnmon", "thresholds"))]
                assert answers[2]["steps"] == 15, answers[2]
                assert answers[4]["path"] == f"{store.url('runs')}/rnnmon_thresholds.json", answers[4]
                cached = sorted(os.listdir(next((tmp_path / "cache").iterdir()) / "tree"))
                assert cached == ["exp1", "exp2"]
            finally:
                server.terminate()
                output = server.communicate(timeout=30)[0]
        finally:
            for name in store.env:
                os.environ.pop(name, None)
    text = json.dumps(answers) + output
    assert SECRET not in text and TOKEN not in text


@pytest.mark.slow
@pytest.mark.parametrize("url", [f"s3://rnnmon-key:{SECRET}@bucket/runs", f"gs://bucket/runs?token={TOKEN}"])
def test_tensorboard_refuses_a_log_directory_url_that_carries_credentials_without_repeating_them(url, tmp_path):
    """`tensorboard --logdir s3://KEY:SECRET@…` was not refused, and rnnmon's own warning printed the secret."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run([sys.executable, "-m", "tensorboard.main", "--logdir", url, "--port", str(port),
                             "--host", "127.0.0.1"], env=dict(os.environ, RNNMON_CACHE_DIR=str(tmp_path / "cache")),
                            capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "must not carry credentials" in output, output[-2000:]
    assert SECRET not in output and TOKEN not in output and "rnnmon-key" not in output
    assert not (tmp_path / "cache").exists()  # nothing mirrored, nothing cached
