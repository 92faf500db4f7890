"""Faults during a fit: a hung driver, a full disk, a deleted log_dir, an alert hook that exits.

Monitoring may degrade with one clear log line; the fit itself always runs to its end, on time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import keras
import pytest
from conftest import mounted_tmpfs, read_run, run_status, stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed

from rnnmon import UtilizationMonitor
from rnnmon.format.logdir import read_logdir

DEVICE_CALLS = ("nvmlDeviceGetSamples", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
                "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo",
                "nvmlDeviceGetTemperature", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetFieldValues")


class AtBatch(keras.callbacks.Callback):
    """Runs `actions[batch]()` after that batch. When `fit` reaches this callback's `on_train_end` (after rnnmon's,
    which comes first) it keeps `at_end()`'s answer in `seen_at_end`, and in `ended_s` the seconds since the last
    batch ended."""

    def __init__(self, at_end: Callable[[], object] | None = None, **actions) -> None:
        super().__init__()
        self.actions = {int(k[1:]): v for k, v in actions.items()}
        self.at_end = at_end
        self.last_end = 0.0
        self.seen_at_end: object = None

    def on_train_batch_end(self, batch, logs=None):
        if batch in self.actions:
            self.actions[batch]()
        self.last_end = time.monotonic()

    def on_train_end(self, logs=None):
        self.ended_s = time.monotonic() - self.last_end
        self.seen_at_end = self.at_end() if self.at_end else None


def _messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rnnmon" and r.levelno == level]


def _finished_run(run_dir, within_s: float):
    """The run in `run_dir` once its status reads "finished" (its writer lands it from the background), or as it
    is after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(KeyError, ValueError):
            if read_run(str(run_dir)).info.get("status") == "finished":
                break
        time.sleep(0.2)
    return read_run(str(run_dir))


@pytest.mark.slow
def test_hung_driver_neither_holds_up_writes_nor_the_end_of_fit(tmp_path, caplog):
    lib = FakeNvmlLib([FakeGpu(pids=[os.getpid()])])
    seen: dict[str, int] = {}

    def hang():  # longer than rnnmon's 2 s deadline per NVML call
        lib.latency_s.update(dict.fromkeys(DEVICE_CALLS, 4.0))

    def count_on_disk():
        seen["steps"] = len(read_run(str(tmp_path)).steps)

    def at_end():  # each hung call holds the sampler 2 s, one metric after another: it is still in the driver
        return {"sampler in the driver": any(t.name == "rnnmon-sampler" for t in threading.enumerate()),
                "status": run_status(tmp_path)}

    marks = AtBatch(b5=hang, b110=count_on_disk, at_end=at_end)
    with installed(lib):
        model = tiny_model()
        model.fit(stalled_dataset(120, 0.03), epochs=1, verbose=0,
                  callbacks=[UtilizationMonitor(str(tmp_path), devices="all", flush_secs=0.5), marks])
    assert seen["steps"] >= 60  # flushes went on while every driver call hung (one thread used to do both)
    # The end did not wait for the hung poll: the final status was on disk while the sampler still hung.
    assert marks.seen_at_end == {"sampler in the driver": True, "status": "finished"}
    assert not _messages(caplog, logging.ERROR)  # nor for the 5 s the end gives the last write
    lib.latency_s.clear()
    for thread in threading.enumerate():  # the abandoned driver calls return within 4 s
        if thread.name.startswith("rnnmon"):
            thread.join(6.0)
    run = read_run(str(tmp_path))
    assert run.info["status"] == "finished" and len(run.steps) == 120


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_alert_hook_that_exits_ends_hooks_not_recording(tmp_path, caplog):
    calls = []

    def on_alert(event):
        calls.append(event.rule)
        raise SystemExit(3)

    model = tiny_model()
    thresholds = {"input_wait_high": {"pct": 5, "resolve_pct": 2, "for_s": 0.1}}
    history = model.fit(stalled_dataset(60, 0.02, prefetch="none"), epochs=1, verbose=0, callbacks=[
        UtilizationMonitor(str(tmp_path), flush_secs=0.3, thresholds=thresholds, on_alert=on_alert)])
    assert len(history.history["loss"]) == 1  # SystemExit did not escape fit
    assert len(calls) == 1
    errors = _messages(caplog, logging.ERROR)
    assert len(errors) == 1 and "raised SystemExit" in errors[0]
    run = read_run(str(tmp_path))
    assert run.info["status"] == "finished" and len(run.steps) == 60
    assert run.alerts  # alerts are still recorded


@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB tmpfs (root only)."""
    with mounted_tmpfs(tmp_path / "disk", "2m") as mount:
        yield mount


def _fill(path) -> None:
    with contextlib.suppress(OSError), open(path, "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_full_disk_is_survived_and_the_status_lands_when_space_returns(small_disk, caplog):
    filler = small_disk / "filler"
    marks = AtBatch(b10=lambda: _fill(filler), at_end=lambda: run_status(small_disk / "exp"))
    model = tiny_model()
    # 400 steps write more than the 4 KiB a tmpfs page may still have free after the fill, so a write must fail.
    history = model.fit(stalled_dataset(400, 0.002), epochs=1, verbose=0,
                        callbacks=[UtilizationMonitor(str(small_disk / "exp"), flush_secs=0.3), marks])
    assert len(history.history["loss"]) == 1  # never raised into fit
    assert marks.seen_at_end != "finished"  # the fit ended without waiting for space to write its status ...
    errors = _messages(caplog, logging.ERROR)
    assert not any("did not finish within" in e for e in errors)  # ... nor for the 5 s the end gives the write
    assert any("No space left on device" in e for e in errors)
    assert sum("cannot write" in e for e in errors) == 1  # logged once
    filler.unlink()  # space returns after the fit: the writer thread is still retrying
    run = _finished_run(small_disk / "exp", within_s=10)
    assert run.info["status"] == "finished" and len(run.steps) == 400  # nothing was lost
    assert read_logdir(str(small_disk))["exp/rnnmon"].errors == []  # no half-written record before the retries
    deadline = time.monotonic() + 10  # logged by the writer thread after its write (and the index's) lands
    while not any("writing to" in m and "again" in m for m in _messages(caplog, logging.WARNING)):
        assert time.monotonic() < deadline, _messages(caplog, logging.WARNING)
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_deleted_log_dir_is_recreated_with_a_warning(tmp_path, caplog):
    log_dir = tmp_path / "exp"

    def delete():
        time.sleep(0.5)  # at least one flush reached the file first
        shutil.rmtree(log_dir)

    model = tiny_model()
    model.fit(stalled_dataset(40), epochs=1, verbose=0,
              callbacks=[UtilizationMonitor(str(log_dir), flush_secs=0.2), AtBatch(b20=delete)])
    assert sum("was deleted during the fit; recreating it" in m for m in _messages(caplog, logging.WARNING)) == 1
    run = read_run(str(log_dir))  # through TensorBoard's loader: it needs every tag's metadata in the new file
    assert run.info["status"] == "finished" and run.info["steps"] == 40
    assert run.findings  # written at the fit's start, into the deleted file: written again
    assert 0 < len(run.steps) < 40 and run.steps[-1, 0] == 40  # what was on disk before is gone, the rest is there


@pytest.mark.usefixtures("no_nvml")
def test_second_writer_of_a_run_is_refused_and_trains_unmonitored(tmp_path, caplog, traced_model):
    run_dir = tmp_path / "exp" / "rnnmon"
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(run_dir / 'rnnmon.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode())\n"
        "print('locked', flush=True); time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        model = traced_model
        history = model.fit(stalled_dataset(10), epochs=1, verbose=0,
                            callbacks=[UtilizationMonitor(str(tmp_path / "exp"))])
        assert len(history.history["loss"]) == 1
        errors = _messages(caplog, logging.ERROR)
        assert len(errors) == 1 and f"another monitor (pid {holder.pid}) is writing" in errors[0]
        assert not any("tfevents" in name for name in os.listdir(run_dir))
    finally:
        holder.kill()
        holder.wait()
    model.fit(stalled_dataset(10), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path / "exp"))])
    assert read_run(str(tmp_path / "exp")).info["status"] == "finished"  # the dead holder's lock is gone


def test_a_monitor_of_this_process_still_finishing_is_waited_for_not_refused(tmp_path):
    from rnnmon.format.run_lock import RunLock

    finishing, released = RunLock(str(tmp_path / "rnnmon")), threading.Event()
    finishing.acquire()  # an aborted fit's monitor, ended by its background thread, still writing its last chunk

    def finish() -> None:
        released.set()  # before the release: once the lock is free, this is already true
        finishing.release()

    threading.Timer(0.3, finish).start()
    RunLock(str(tmp_path / "rnnmon")).acquire()  # refusing raises "another monitor (pid ...) is writing"
    assert released.is_set()  # it returned once the finishing monitor let go: it waited for it


def test_a_tick_that_raises_systemexit_is_logged_once_and_ticking_goes_on(caplog):
    from rnnmon.capture.ticker import Ticker

    ticks, stopped = [], threading.Event()

    def tick():
        ticks.append(1)
        raise SystemExit(1) if len(ticks) % 2 else KeyboardInterrupt

    ticker = Ticker(0.01, tick, name="rnnmon-test", on_stop=stopped.set)
    ticker.start()
    deadline = time.monotonic() + 10
    while len(ticks) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ticker.stop(timeout_s=5) and stopped.is_set()  # the thread lived on and its stop hook ran
    assert len(ticks) >= 5
    assert len(_messages(caplog, logging.ERROR)) == 1 and "rnnmon-test failed" in caplog.text


def test_records_held_while_the_disk_is_full_are_capped_the_oldest_dropped(tmp_path):
    from rnnmon.format.eventfile import EventFileAppender, scan_records

    with EventFileAppender(str(tmp_path), max_pending_bytes=250) as out:
        for i in range(10):
            out.add(bytes([i]) * 100)  # unwritten: as if every flush had failed
        assert out.pending == 2 and out.dropped == 8
    assert scan_records(out.path).records == [bytes([8]) * 100, bytes([9]) * 100]


@pytest.fixture
def freezable_disk(tmp_path):
    """A real 16 MiB ext4 filesystem on a loop device, which `fsfreeze -f` makes every write block on (root only)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("mkfs.ext4", "mount", "fsfreeze")):
        pytest.skip("freezing a filesystem needs root, mkfs.ext4, mount(8) and fsfreeze(8)")
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    done = made.returncode == 0 and subprocess.run(["mount", "-o", "loop", str(image), str(mount)],
                                                   capture_output=True).returncode == 0
    if not done:
        pytest.skip("cannot mount a loop device here")
    try:
        yield mount
    finally:
        subprocess.run(["fsfreeze", "-u", str(mount)], capture_output=True, check=False)
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_a_write_that_blocks_holds_up_the_end_of_fit_5_s_at_most(freezable_disk, caplog):
    thaw = threading.Timer(30, subprocess.run, (["fsfreeze", "-u", str(freezable_disk)],))  # a hang fails, ends

    def freeze():  # every write to the run's folder now blocks, as on a hung NFS server
        subprocess.run(["fsfreeze", "-f", str(freezable_disk)], check=True)
        thaw.start()

    marks = AtBatch(b30=freeze, at_end=lambda: thaw.finished.is_set())
    try:
        history = tiny_model().fit(stalled_dataset(40, 0.01), epochs=1, verbose=0, callbacks=[
            UtilizationMonitor(str(freezable_disk / "exp"), flush_secs=0.2), marks])
    finally:
        thaw.cancel()
        subprocess.run(["fsfreeze", "-u", str(freezable_disk)], capture_output=True, check=False)
    assert len(history.history["loss"]) == 1 and marks.ended_s > 4.5  # waited 5 s for the write ...
    assert marks.seen_at_end is False  # ... then left while the disk was still frozen
    errors = _messages(caplog, logging.ERROR)
    assert len(errors) == 1 and "did not finish within 5 s" in errors[0], errors
    run = _finished_run(freezable_disk / "exp", within_s=20)  # thawed: the blocked write, then the end, land
    assert run.info["status"] == "finished" and len(run.steps) == 40
