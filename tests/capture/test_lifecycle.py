"""One monitor across several fits, aborted fits, and processes that are told to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import keras
import pytest
from conftest import TESTS, read_run, run_status, stalled_dataset, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize


def _rnnmon_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rnnmon")]


class FailAt(keras.callbacks.Callback):
    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise RuntimeError("boom")


@pytest.mark.usefixtures("no_nvml")
def test_one_instance_serves_repeated_fits(tmp_path, traced_model):
    model, monitor = traced_model, UtilizationMonitor(str(tmp_path))
    for _ in range(2):
        model.fit(stalled_dataset(12), epochs=2, verbose=0, callbacks=[monitor])
        assert not _rnnmon_threads()
        assert not hasattr(model.train_function, "__rnnmon_original__")
    run = read_run(str(tmp_path))
    assert run.fits == 2 and len(run.steps) == 48
    assert run.steps[:, 0].tolist() == list(range(1, 49))  # global steps continue across fits


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize("same_instance", [True, False])
def test_aborted_fit_then_new_fit_leaves_nothing_behind(tmp_path, same_instance):
    model, first = tiny_model(), UtilizationMonitor(str(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(stalled_dataset(20), epochs=1, verbose=0, callbacks=[first, FailAt(5)])
    second = first if same_instance else UtilizationMonitor(str(tmp_path))
    model.fit(stalled_dataset(10), epochs=1, verbose=0, callbacks=[second])
    assert not _rnnmon_threads()
    assert not hasattr(model.train_function, "__rnnmon_original__")
    run = read_run(str(tmp_path))
    assert len(run.steps) == 6 + 10  # the aborted fit's steps reached disk too
    assert run.info["status"] == "finished" and run.fits == 2


@pytest.mark.usefixtures("no_nvml")
def test_error_inside_the_step_writes_everything_at_once(tmp_path, traced_model):
    def delay(batch):
        if batch == 7:
            raise ValueError("bad record")
        return 0.0

    model = traced_model
    with pytest.raises(Exception, match="bad record"):
        model.fit(stalled_dataset(20, delay), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
    assert not _rnnmon_threads()
    assert not hasattr(model.train_function, "__rnnmon_original__")
    run = read_run(str(tmp_path))  # read at once: no waiting for a periodic flush
    assert run.info["status"] == "failed" and len(run.steps) == 7


CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from conftest import stalled_dataset, tiny_model
    from fake_nvml import library_missing
    from rnnmon import UtilizationMonitor

    with library_missing():
        model = tiny_model()
        class Ready(__import__("keras").callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 20:
                    print("ready", flush=True)
        model.fit(stalled_dataset(2000, 0.01), epochs=1, verbose=0,
                  callbacks=[UtilizationMonitor({logdir!r}, flush_secs=5), Ready()])
""")


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted")])
def test_signals_write_everything_before_the_process_ends(tmp_path, signum, status):
    script = CHILD.format(tests=TESTS, logdir=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        child.send_signal(signum)
        if signum == signal.SIGTERM:
            assert child.wait(timeout=60) == -signal.SIGTERM  # the default action still ends the process
        # After Ctrl-C, TensorFlow with a py_function pipeline can hang at exit with or without rnnmon;
        # the record must be on disk anyway.
        deadline = time.monotonic() + 30
        while run_status(tmp_path) in (None, "running") and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        child.kill()
        child.wait()
    run = read_run(str(tmp_path))
    assert run.info["status"] == status
    assert len(run.steps) > 20 and run.info["steps"] == len(run.steps)  # flush_secs=5: only the exit path wrote


IGNORING_CHILD = textwrap.dedent("""
    import signal, sys
    sys.path.insert(0, {tests!r})
    import keras
    from conftest import stalled_dataset, tiny_model
    from fake_nvml import library_missing
    from rnnmon import UtilizationMonitor

    class Ready(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 20:
                print("ready", signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)

    with library_missing():
        tiny_model().fit(stalled_dataset(300, 0.01), epochs=1, verbose=0,
                         callbacks=[UtilizationMonitor({logdir!r}, flush_secs=5), Ready()])
    print("trained", flush=True)
""")


@pytest.mark.slow
def test_sigint_to_a_process_that_ignores_it_neither_stops_the_fit_nor_ends_the_record(tmp_path):
    """As a `cmd &` job of a non-interactive shell: started with SIGINT ignored, it stays ignored (this used to end
    the record "interrupted" at the signal while training ran on)."""
    script = IGNORING_CHILD.format(tests=TESTS, logdir=str(tmp_path))
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec, as a shell starts the job
    try:
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert child.stdout.readline().split() == ["ready", "True"]  # rnnmon installed nothing over SIG_IGN
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=120) == 0
        assert child.stdout.read().split() == ["trained"]
    finally:
        child.kill()
        child.wait()
    run = read_run(str(tmp_path))
    assert run.info["status"] == "finished" and len(run.steps) == run.info["steps"] == 300


@pytest.mark.usefixtures("no_nvml")
def test_a_users_sigint_handler_runs_after_rnnmon_has_written_the_record(tmp_path, traced_model):
    model, seen = traced_model, []

    def handler(signum, frame):  # e.g. "stop after this batch, then save"
        seen.append(run_status(tmp_path))
        model.stop_training = True

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 5:
                os.kill(os.getpid(), signal.SIGINT)  # handled on this thread before the next batch

    previous = signal.signal(signal.SIGINT, handler)
    try:
        model.fit(stalled_dataset(200), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path)), Interrupt()])
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == ["interrupted"]  # rnnmon's handler wrote the record first, then chained to the user's
    assert after is handler  # and put it back
    run = read_run(str(tmp_path))
    assert run.info["status"] == "interrupted" and len(run.steps) == run.info["steps"] >= 6


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_unwritable_log_dir_trains_unmonitored_with_one_error(tmp_path, caplog):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the log directory should be")
    model = tiny_model()
    history = model.fit(stalled_dataset(10), epochs=2, verbose=0,
                        callbacks=[UtilizationMonitor(str(blocker / "exp"))])
    assert len(history.history["loss"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.name == "rnnmon" and r.levelname == "ERROR"]
    assert len(errors) == 1 and "monitoring is off for this fit" in errors[0]
    assert not _rnnmon_threads() and not hasattr(model.train_function, "__rnnmon_original__")


class FailAtEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise OSError("disk of another callback")


def _wait_until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_exception_in_a_later_callback_ends_monitoring_before_fit_returns(tmp_path):
    model = tiny_model()
    with pytest.raises(OSError, match="disk of another callback"):
        model.fit(stalled_dataset(12), epochs=2, verbose=0,
                  callbacks=[UtilizationMonitor(str(tmp_path)), FailAtEpochEnd()])
    # At once, not at the sampler's next poll: the hook's own call ended monitoring.
    assert not _rnnmon_threads()
    assert not hasattr(model.train_function, "__rnnmon_original__")
    run = read_run(str(tmp_path))
    assert run.info["status"] == "failed" and len(run.steps) == 12


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_exception_outside_any_hook_ends_monitoring_at_the_next_poll(tmp_path):
    def broken_validation():
        raise OSError("validation files gone")
        yield  # a generator: Keras reads its first batches when validation starts, outside any hook

    model = tiny_model()
    with pytest.raises(OSError, match="validation files gone"):
        model.fit(stalled_dataset(12), epochs=1, verbose=0, validation_data=broken_validation(),
                  callbacks=[UtilizationMonitor(str(tmp_path), sample_interval_s=0.1)])
    # A later fit without rnnmon, at once: the wrapper sees it is not its fit, steps aside and removes itself.
    model.fit(stalled_dataset(4), epochs=1, verbose=0)
    assert not hasattr(model.train_function, "__rnnmon_original__")
    assert _wait_until(lambda: not _rnnmon_threads())  # the sampler noticed the fit is over
    run = read_run(str(tmp_path))
    assert run.info["status"] == "failed" and len(run.steps) == 12


class SleepThenInterrupt(keras.callbacks.Callback):
    """Sleeps `sleep_s` in every batch hook; raises KeyboardInterrupt (as Ctrl-C would) after `interrupt_after`."""

    def __init__(self, sleep_s: float, interrupt_after: int | None = None) -> None:
        super().__init__()
        self.sleep_s, self.interrupt_after, self.batches = sleep_s, interrupt_after, 0

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.sleep_s)
        self.batches += 1
        if self.batches == self.interrupt_after:
            raise KeyboardInterrupt


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_interrupted_fit_and_its_rerun_in_one_log_dir_give_the_true_callback_time(tmp_path):
    model = tiny_model()
    with pytest.raises(KeyboardInterrupt):
        model.fit(stalled_dataset(20), epochs=1, verbose=0,
                  callbacks=[UtilizationMonitor(str(tmp_path)), SleepThenInterrupt(0.03, interrupt_after=12)])
    assert not _rnnmon_threads() and not hasattr(model.train_function, "__rnnmon_original__")
    assert read_run(str(tmp_path)).info["status"] == "interrupted"
    model.fit(stalled_dataset(4), epochs=1, verbose=0,
              callbacks=[UtilizationMonitor(str(tmp_path)), SleepThenInterrupt(0.03)])
    summary = summarize(read_run(str(tmp_path)))
    assert summary["fits"] == 2 and summary["steps"] == 16
    # Every step of both fits slept 30 ms in the callback: the interrupted fit's time counts with its steps.
    assert 30.0 <= summary["callback_ms_per_step"]["SleepThenInterrupt"] < 60.0


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_second_monitor_in_one_fit_is_refused_with_one_error(tmp_path, caplog):
    first, second = UtilizationMonitor(str(tmp_path / "a")), UtilizationMonitor(str(tmp_path / "b"))
    model = tiny_model()
    model.fit(stalled_dataset(10), epochs=1, verbose=0, callbacks=[first, second])
    errors = [r.getMessage() for r in caplog.records if r.name == "rnnmon" and r.levelname == "ERROR"]
    assert len(errors) == 1 and "two UtilizationMonitors in one fit" in errors[0]
    assert repr(str(tmp_path / "a")) in errors[0] and repr(str(tmp_path / "b")) in errors[0]
    run = read_run(str(tmp_path / "a"))
    assert run.info["status"] == "finished" and len(run.steps) == 10
    assert not (tmp_path / "b").exists()
    model.fit(stalled_dataset(10), epochs=1, verbose=0, callbacks=[second])  # alone, the second one records
    assert read_run(str(tmp_path / "b")).info["status"] == "finished"
