"""One Prometheus endpoint per process: shared by live monitors, closed with the last one, a port per local rank."""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time

import pytest
from conftest import read_run, stalled_dataset, tiny_model
from test_prometheus import scrape, total

from rnnmon import UtilizationMonitor

pytest.importorskip("prometheus_client")


def refused(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) != 0


def wait_for(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_dropped_monitors_leave_no_port_thread_or_descriptor(tmp_path):
    gc.collect()
    threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
    monitors = [UtilizationMonitor(str(tmp_path / f"m{k}"), prometheus_port=0, prometheus_job="sweep")
                for k in range(20)]
    ports = {monitor.prometheus_port for monitor in monitors}
    assert len(ports) == 1 and None not in ports, ports  # one endpoint for the process
    port = ports.pop()
    assert threading.active_count() <= threads + 1
    del monitors
    gc.collect()
    assert wait_for(lambda: refused(port)), "the endpoint outlived its monitors"
    assert wait_for(lambda: threading.active_count() <= threads), threading.enumerate()
    assert wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds)


def test_the_last_monitor_dropped_closes_the_endpoint_without_waiting_out_the_serve_loops_poll(tmp_path, monkeypatch):
    # prometheus_client serves with socketserver's serve_forever, which sees a shutdown when its select() returns:
    # a 30 s poll here, so a close that waits for it fails the 10 s bound by 20 s.
    monkeypatch.setattr(socketserver.BaseServer.serve_forever, "__defaults__", (30.0,))
    held = [UtilizationMonitor(str(tmp_path / "m"), prometheus_port=0, prometheus_job="poll")]
    port = held[0].prometheus_port
    assert port  # no probe first: a connection wakes the loop, and it may then see the shutdown at once
    dropping = threading.Thread(target=lambda: (held.clear(), gc.collect()))
    dropping.start()
    dropping.join(timeout=10.0)
    assert not dropping.is_alive(), "closing the endpoint waited for the serve loop's poll"
    assert refused(port)


@pytest.mark.slow
def test_a_fixed_port_serves_the_next_fit_and_says_when_none_trains(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rnnmon")
    port = free_port()
    first = UtilizationMonitor(str(tmp_path / "a"), prometheus_port=port, flush_secs=0.3)
    tiny_model().fit(stalled_dataset(20), epochs=1, verbose=0, callbacks=[first])
    after_first = scrape(port)
    assert total(after_first, "rnnmon_training") == 0  # the fit is over: its series are not live
    second = UtilizationMonitor(str(tmp_path / "b"), prometheus_port=port, flush_secs=0.3)
    assert second.prometheus_port == port
    seen = {}

    class Scrape(__import__("keras").callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 10:
                seen.update(scrape(port))

    tiny_model().fit(stalled_dataset(30), epochs=1, verbose=0, callbacks=[second, Scrape()])
    assert total(seen, "rnnmon_training") == 1
    after = scrape(port)
    assert total(after, "rnnmon_training") == 0
    assert total(after, "rnnmon_steps_total") == 50  # one label set: the fits add up, no duplicate series
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert read_run(str(tmp_path / "b")).steps.shape[0] == 30
    del first, second
    gc.collect()
    assert wait_for(lambda: refused(port))


def test_the_port_is_the_base_plus_the_local_rank_and_a_file_sd_target_is_written(tmp_path, monkeypatch):
    base = free_port() - 3
    monkeypatch.setenv("LOCAL_RANK", "3")
    sd_dir = tmp_path / "sd"
    monitor = UtilizationMonitor(str(tmp_path / "run"), prometheus_port=base, prometheus_sd_dir=str(sd_dir))
    assert monitor.prometheus_port == base + 3
    assert total(scrape(base + 3), "rnnmon_training") == 0
    [target] = os.listdir(sd_dir)
    with open(sd_dir / target, encoding="utf-8") as file:
        [group] = json.load(file)
    assert group["targets"] == [f"127.0.0.1:{base + 3}"]
    assert group["labels"] == {"rnnmon_job": "rnnmon", "__meta_rnnmon_machine": socket.gethostname(),
                               "__meta_rnnmon_pid": str(os.getpid())}
    del monitor
    gc.collect()
    assert wait_for(lambda: not os.listdir(sd_dir))  # the target goes with the endpoint


def test_a_kerastuner_copy_keeps_the_endpoint_until_it_is_dropped_too(tmp_path):
    import copy

    monitor = UtilizationMonitor(str(tmp_path), prometheus_port=0, prometheus_job="search")
    port = monitor.prometheus_port
    trial = copy.deepcopy(monitor)
    assert trial.prometheus_port == port and trial._exporter is monitor._exporter
    del monitor
    gc.collect()
    assert total(scrape(port), "rnnmon_training", job="search") == 0  # still served: the copy holds it
    del trial
    gc.collect()
    assert wait_for(lambda: refused(port))


def test_a_new_endpoint_removes_the_targets_of_dead_processes_of_its_machine_only(tmp_path):
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    machine = socket.gethostname()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        live_port = listening.getsockname()[1]
        files = {"dead.json": (machine, gone.stdout.strip(), 1),  # SIGKILLed: its pid is gone
                 "reused.json": (machine, str(os.getpid()), free_port()),  # its pid lives on, its port is closed
                 "elsewhere.json": ("another-host", gone.stdout.strip(), 1),  # not this machine's to judge
                 "live.json": (machine, str(os.getpid()), live_port)}
        for name, (host, pid, port) in files.items():
            (sd_dir / name).write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {
                "rnnmon_job": "old", "__meta_rnnmon_machine": host, "__meta_rnnmon_pid": pid}}]))
        (sd_dir / "by-hand.json").write_text(json.dumps([{"targets": ["127.0.0.1:1"]}]))  # not rnnmon's
        monitor = UtilizationMonitor(str(tmp_path / "run"), prometheus_port=free_port(), prometheus_sd_dir=str(sd_dir))
    assert sorted(os.listdir(sd_dir)) == sorted(["elsewhere.json", "live.json", "by-hand.json",
                                                 f"127.0.0.1-{monitor.prometheus_port}.json"])


def test_relabelling_moves_an_owners_series_to_its_worker_name_and_still_closes_with_it():
    from rnnmon.alerts import prometheus

    class Owner:  # a monitor, as far as the endpoint is concerned
        pass

    owner = Owner()
    exporter, port = prometheus.attach(owner, port=0, job="jaxlike")
    prometheus.relabel(owner, exporter, worker="worker-1")  # as on_train_begin does once JAX names the process
    assert {s.labels["worker"] for s in scrape(port)["rnnmon_training"] if s.labels["job"] == "jaxlike"} == {
        "worker-1"}
    del owner, exporter
    gc.collect()
    assert wait_for(lambda: refused(port))  # the relabelled hold goes with its owner


def test_a_link_planted_as_the_file_sd_temporary_file_is_never_written_through(tmp_path):
    """The `.tmp` file was opened through a planted symlink: the link's target was overwritten."""
    port = free_port()
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, sd_dir / f"127.0.0.1-{port}.json.tmp")
    monitor = UtilizationMonitor(str(tmp_path / "run"), prometheus_port=port, prometheus_sd_dir=str(sd_dir))
    assert monitor.prometheus_port == port
    assert victim.read_text() == "precious"
    target = sd_dir / f"127.0.0.1-{port}.json"
    assert not target.is_symlink() and json.loads(target.read_text())[0]["targets"] == [f"127.0.0.1:{port}"]
    del monitor
    gc.collect()


def test_the_sweep_of_dead_targets_neither_waits_on_a_fifo_nor_follows_a_link(tmp_path):
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    os.mkfifo(sd_dir / "fifo.json")  # opened for reading, it would wait for a writer forever
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps([{"targets": ["127.0.0.1:1"], "labels": {
        "__meta_rnnmon_machine": socket.gethostname(), "__meta_rnnmon_pid": "0"}}]))  # a dead process's, if read
    os.symlink(elsewhere, sd_dir / "link.json")
    built: list[UtilizationMonitor] = []
    thread = threading.Thread(target=lambda: built.append(UtilizationMonitor(
        str(tmp_path / "run"), prometheus_port=free_port(), prometheus_sd_dir=str(sd_dir))), daemon=True)
    thread.start()
    thread.join(30)
    assert built, "the monitor waited on the FIFO"
    assert sorted(os.listdir(sd_dir)) == sorted(["fifo.json", "link.json",
                                                 f"127.0.0.1-{built[0].prometheus_port}.json"])  # left alone
