"""The tab over files that are not what their names say, or that change under it.

A FIFO, a link to /dev/zero, a huge sparse file named like an event file in a run folder, a FIFO where the
thresholds file belongs: every route answers within a deadline, the other runs read, and TensorBoard's memory stays
bounded, in-process and in a real TensorBoard. A live run's file cut below what the tab read, then appended to:
`/summary` shows the new steps, or names the damage as `/runs` does; never a stale 200.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from rnnmon_tensorboard.plugin import RnnmonPlugin
from synthetic_runs import write_gpu_run
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

from rnnmon.alerts.thresholds_file import THRESHOLDS_FILE
from rnnmon.format import schema
from rnnmon.format.eventfile import frame, scan_records
from rnnmon.format.writer import SummaryWriter

ROUTE = "/data/plugin/rnnmon/"
HOSTILE = "events.out.tfevents.9999999999.hostile"
DEADLINE_S = 60  # the routes below answer in well under a second; a hang runs into this
MEMORY_GUARD = 3 << 30  # TensorBoard is killed past this (the issue saw it grow past 4 GB)
ASKED = ["runs", "thresholds", "workers?run=job/worker-0/rnnmon", "summary?run=healthy/rnnmon"]


def _runs(root) -> None:
    for run in ("healthy", "fifo", "job/worker-0", "job/worker-1"):
        write_gpu_run(str(root / run / "rnnmon"), 5)


def _fifos(root) -> list[str]:
    """A FIFO named like an event file in a run and in a sibling worker, and one where the thresholds file goes."""
    paths = [str(root / "fifo" / "rnnmon" / HOSTILE), str(root / "job" / "worker-1" / "rnnmon" / HOSTILE),
             str(root / THRESHOLDS_FILE)]
    for path in paths:
        os.mkfifo(path)
    return paths


def _release(fifos: list[str]) -> None:
    """Give a reader blocked on opening one of `fifos` its end of file, so that a hung test can end."""
    for path in fifos:
        with contextlib.suppress(OSError):  # ENXIO: nobody has it open for reading
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _client(logdir) -> werkzeug_test.Client:
    """The plugin as TensorBoard serves it, over TensorBoard's data provider loaded once, now: for a local log
    directory the plugin reads the runs' files itself, and the provider only says which runs exist."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"rnnmon": 0})
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    plugin = RnnmonPlugin(base_plugin.TBContext(logdir=str(logdir), data_provider=provider))
    return werkzeug_test.Client(application.TensorBoardWSGI([plugin], data_provider=provider))


def _get_json(client: werkzeug_test.Client, route: str) -> tuple[int, object]:
    response = client.get(ROUTE + route)
    return response.status_code, response.get_json() if response.is_json else response.text


def test_routes_answer_beside_fifos_named_like_an_event_file_and_the_thresholds_file(tmp_path):
    _runs(tmp_path)
    client = _client(tmp_path)  # before the FIFOs: TensorBoard's own Python loader would block on them (its limit)
    fifos = _fifos(tmp_path)
    answers: dict[str, tuple[int, object]] = {}

    def ask() -> None:
        for route in ASKED:
            answers[route] = _get_json(client, route)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(DEADLINE_S)
    hung, answered = asking.is_alive(), list(answers)
    while asking.is_alive():  # let a hung route finish, so the test ends
        _release(fifos)
        asking.join(0.2)
    assert not hung, f"no answer within {DEADLINE_S} s; answered: {answered}"
    _check_answers(answers)


def _check_answers(answers: dict[str, tuple[int, object]]) -> None:
    assert all(status == 200 for status, _ in answers.values()), answers
    runs = {run["run"]: run for run in answers["runs"][1]["runs"]}
    assert {"healthy/rnnmon", "fifo/rnnmon", "job/worker-0/rnnmon", "job/worker-1/rnnmon"} <= set(runs)
    assert runs["healthy/rnnmon"]["errors"] == [] and runs["job/worker-0/rnnmon"]["errors"] == []
    for run in ("fifo/rnnmon", "job/worker-1/rnnmon"):
        assert runs[run]["errors"] == [f"{HOSTILE}: cannot read: not a regular file (a FIFO)"], runs[run]
    thresholds = answers["thresholds"][1]
    assert thresholds["source"] == "defaults" and thresholds["version"] == "none" and not thresholds["writable"]
    assert answers["workers?run=job/worker-0/rnnmon"][1]["job"] == "job"
    assert answers["summary?run=healthy/rnnmon"][1]["steps"] == 25


def _get(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=DEADLINE_S) as response:  # a hang: TimeoutError, the test fails
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and its children (TensorBoard's Rust data server)."""
    parents, rss = {}, {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/statm") as f:
                rss[int(entry)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    tree, grown = {pid}, True
    while grown:
        children = {p for p, parent in parents.items() if parent in tree} - tree
        tree, grown = tree | children, bool(children)
    return sum(rss.get(p, 0) for p in tree)


class _MemoryGuard(threading.Thread):
    """Notes the peak memory of a process tree; kills the process past MEMORY_GUARD, before it takes the machine."""

    def __init__(self, process: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.process, self.peak, self.killed = process, 0, False
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2) and self.process.poll() is None:
            self.peak = max(self.peak, _tree_rss(self.process.pid))
            if self.peak > MEMORY_GUARD:
                self.killed = True
                self.process.kill()

    def stop(self) -> None:
        self._done.set()
        self.join()


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["--load_fast=true", "--load_fast=false"])  # the Rust data server, Python's
def test_real_tensorboard_answers_beside_a_fifo_dev_zero_and_a_sparse_event_file(tmp_path, loader):
    _runs(tmp_path)
    for run in ("dev_zero", "sparse"):
        write_gpu_run(str(tmp_path / run / "rnnmon"), 5)
    os.symlink("/dev/zero", tmp_path / "dev_zero" / "rnnmon" / HOSTILE)
    with open(tmp_path / "sparse" / "rnnmon" / HOSTILE, "wb") as f:
        f.truncate(8 << 30)
    fifos = _fifos(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path), "--port",
                               str(port), "--host", "127.0.0.1", loader],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    guard = _MemoryGuard(server)
    guard.start()
    route = f"http://127.0.0.1:{port}{ROUTE}"
    rust = loader == "--load_fast=true"
    try:
        deadline, runs = time.monotonic() + 90, {}
        while time.monotonic() < deadline and len(runs) < (6 if rust else 1):
            time.sleep(0.5)
            assert server.poll() is None, f"TensorBoard ended; killed past {MEMORY_GUARD} bytes: {guard.killed}"
            try:
                status, body = _get(route + "runs")
            except urllib.error.URLError as error:
                if isinstance(error.reason, ConnectionRefusedError):
                    continue  # not up yet
                raise
            except ConnectionError:
                continue
            assert status == 200, body
            runs = {run["run"]: run for run in body["runs"]}
        answers = {path: _get(route + path) for path in ASKED[1:]}
        if rust:
            assert set(runs) == {"healthy/rnnmon", "fifo/rnnmon", "dev_zero/rnnmon", "sparse/rnnmon",
                                 "job/worker-0/rnnmon", "job/worker-1/rnnmon"}
            assert runs["dev_zero/rnnmon"]["errors"] == [
                f"{HOSTILE}: cannot read: not a regular file (a character device)"]
            assert "corrupt record header at byte 0" in runs["sparse/rnnmon"]["errors"][0]
            _check_answers({"runs": (200, body), **answers})
        else:  # TensorBoard's own Python loader (TensorFlow's file reader) blocks for good on the first FIFO it
            # opens and never loads the runs after it: what it loaded is listed, and every route answers
            assert runs and all(answer[0] in (200, 404) for answer in answers.values()), answers
            assert answers["thresholds"][0] == 200
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        guard.stop()
        _release(fifos)
    assert not guard.killed, f"TensorBoard grew past {MEMORY_GUARD} bytes"
    assert guard.peak < 2 << 30, guard.peak


def _chunk(writer: SummaryWriter, first: int, count: int = 10) -> None:
    start = time.time()
    writer.table(schema.STEPS_TAG, [(step, 0, start + 0.05 * step, start + 0.05 * step + 0.04, 5.0, 1.0, 1)
                                    for step in range(first, first + count)])
    writer.flush()


def test_summary_follows_a_live_file_cut_below_what_it_read(tmp_path):
    run_dir = str(tmp_path / "live" / "rnnmon")
    writer = SummaryWriter(run_dir)
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": time.time()})
    for first in range(1, 41, 10):
        _chunk(writer, first)
    client = _client(tmp_path)
    assert _get_json(client, "summary?run=live/rnnmon")[1]["steps"] == 40
    (name,) = [n for n in os.listdir(run_dir) if "tfevents" in n]
    path = os.path.join(run_dir, name)
    records = scan_records(path).records
    os.truncate(path, os.path.getsize(path) - len(frame(records[-1])) - len(frame(records[-2])))  # at a record
    _chunk(writer, 41)  # the writer appends at the cut: less than was cut
    status, summary = _get_json(client, "summary?run=live/rnnmon")
    assert status == 200 and summary["steps"] == 50  # 1-50: those it read before the cut, and the new ones
    os.truncate(path, os.path.getsize(path) - len(frame(scan_records(path).records[-1])) // 2)  # in steps 41-50
    _chunk(writer, 51)
    _chunk(writer, 61)
    writer.close()
    # The cut record's bytes are skipped and named; every readable step is served (this was a 422 that hid them).
    status, summary = _get_json(client, "summary?run=live/rnnmon")
    (run,) = _get_json(client, "runs")[1]["runs"]
    assert status == 200 and summary["steps"] == 70 and not summary["errors"], summary  # 41-50 read before the cut
    (cut,) = run["notes"]
    assert not run["errors"] and "skipped, read on from the next whole record" in cut and summary["notes"] == [cut]
    status, timeline = _get_json(client, "timeline?run=live/rnnmon")
    assert status == 200 and timeline["steps"]["total"] == 70 and timeline["notes"] == [cut]


def test_a_file_that_ends_inside_a_record_serves_its_records_with_the_cut_as_a_note(tmp_path):
    """A writer stopped mid-append (SIGKILL, a full disk): past the grace time the half-written record was an
    error, and every route answered 422, hiding the steps before it."""
    run_dir = str(tmp_path / "job" / "worker-0" / "rnnmon")
    write_gpu_run(run_dir, 20, status="running")
    write_gpu_run(str(tmp_path / "job" / "worker-1" / "rnnmon"), 20)
    (name,) = [n for n in os.listdir(run_dir) if "tfevents" in n]
    path = os.path.join(run_dir, name)
    os.truncate(path, os.path.getsize(path) - len(frame(scan_records(path).records[-1])) // 2)
    os.utime(path, (time.time() - 60, time.time() - 60))  # no writer is still finishing the record
    client = _client(tmp_path)
    (run, _) = _get_json(client, "runs")[1]["runs"]
    (cut,) = run["notes"]
    assert not run["errors"] and cut == f"{name}: truncated: the file ends inside the record at byte " \
                                        f"{scan_records(path).offset}", run
    for route in ("summary", "timeline"):
        status, body = _get_json(client, f"{route}?run=job/worker-0/rnnmon")
        assert status == 200 and body["notes"] == [cut], (route, body)
    assert _get_json(client, "summary?run=job/worker-0/rnnmon")[1]["steps"] == 95  # all but the cut record's 5
    status, workers = _get_json(client, "workers?run=job/worker-0/rnnmon")
    assert status == 200 and [w["worker"] for w in workers["workers"]] == ["worker-0", "worker-1"] \
        and not workers["left_out"], workers


def test_runs_follows_a_live_run_beside_a_dangling_link_named_like_an_event_file(tmp_path):
    run_dir = str(tmp_path / "live" / "rnnmon")
    writer = SummaryWriter(run_dir)
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": time.time()})
    _chunk(writer, 1)
    client = _client(tmp_path)
    os.symlink(str(tmp_path / "gone"), os.path.join(run_dir, HOSTILE))
    (run,) = _get_json(client, "runs")[1]["runs"]
    assert run["status"] == "live" and run["errors"] == [f"{HOSTILE}: cannot read: No such file or directory"]
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "finished", "start": time.time()})
    writer.close()
    (run,) = _get_json(client, "runs")[1]["runs"]
    assert run["status"] == "finished"  # the other file's growth seen (the link hid every change of the folder)
