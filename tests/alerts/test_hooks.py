"""The on_alert hook on its own thread: a slow hook costs neither the record nor stop_on_alert, and never waits
unbounded."""

from __future__ import annotations

import logging
import threading
import time

import keras
import pytest
from conftest import read_run, stalled_dataset, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.alerts.hooks import HookThread
from rnnmon.alerts.rules import AlertEvent


def _messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rnnmon" and r.levelno == level]


def _wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


class Batches(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_a_hung_hook_costs_no_step_no_status_and_no_stop(tmp_path, caplog):
    """The issue's case: a hook that outlasts the fit used to hold the writer thread, so a script that exits right
    after `fit` lost the steps and the status; stop_on_alert, decided after the hook, never came."""
    release, called = threading.Event(), threading.Event()

    def slow_hook(event):
        called.set()
        release.wait(60)

    batches, hook_threads = Batches(), []
    thresholds = {"input_wait_high": {"pct": 5, "resolve_pct": 2, "for_s": 0.1}}  # fires at the first flush
    try:
        tiny_model().fit(stalled_dataset(2000, 0.01, prefetch="none"), epochs=1, verbose=0, callbacks=[
            UtilizationMonitor(str(tmp_path), flush_secs=0.3, thresholds=thresholds, on_alert=slow_hook,
                               stop_on_alert=True, audit=False), batches])
        run = read_run(str(tmp_path))  # as the fit returns: a script may exit right here
        hook_threads = [t for t in threading.enumerate() if t.name == "rnnmon-hooks"]
    finally:
        release.set()
        for thread in hook_threads:
            thread.join(10)  # the hook takes the rest and its thread ends: nothing left for the next test
    assert called.wait(10)
    assert batches.count < 2000  # stop_on_alert stopped the fit while the hook hung
    assert run.info["status"] == "finished" and len(run.steps) == batches.count == run.info["steps"]
    assert run.alerts  # recorded, though the hook never took them
    assert [t.daemon for t in hook_threads] == [True]  # the hung hook does not keep the process alive
    errors = _messages(caplog, logging.ERROR)
    assert len(errors) == 1, errors
    assert "the on_alert hook test_hooks.test_a_hung_hook_costs_no_step_no_status_and_no_stop.<locals>.slow_hook " \
           "is slow (on the firing input_wait_high alert for" in errors[0], errors
    assert "the record on disk is complete" in errors[0] and "disk?" not in errors[0]


def _event(start: float) -> AlertEvent:
    return AlertEvent(rule="idle_gap", device=None, state="firing", start=start, end=None, value=2.0,
                      threshold=1.0, message="A gap.")


def test_a_full_queue_drops_later_alerts_and_counts_them(caplog):
    release, seen = threading.Event(), []

    def hook(event):
        seen.append(event.start)
        release.wait(10)

    hooks = HookThread(hook, max_pending=3)
    hooks.submit(_event(0))
    assert _wait_until(lambda: seen == [0])  # the hook is busy with the first
    for start in range(1, 10):
        hooks.submit(_event(start))  # never waits on the hook
    assert hooks.dropped == 6
    release.set()
    hooks.close()
    assert hooks.join(10)
    assert seen == [0, 1, 2, 3]  # in order, the three that found room
    warnings = _messages(caplog, logging.WARNING)
    assert len(warnings) == 2, warnings
    assert "counts_them.<locals>.hook is slow (on the firing idle_gap alert for" in warnings[0]
    assert "6 alerts were not handed to the on_alert hook" in warnings[1]
    assert not [t for t in threading.enumerate() if t.name == "rnnmon-hooks"]


def test_a_hook_that_never_returns_is_waited_for_a_bounded_time_and_named(caplog):
    release = threading.Event()
    hooks = HookThread(lambda event: release.wait(30))
    hooks.submit(_event(0))
    hooks.close()
    try:
        began = time.monotonic()
        assert not hooks.join(0.2)
        assert time.monotonic() - began < 5
    finally:
        release.set()
    errors = _messages(caplog, logging.ERROR)
    assert len(errors) == 1 and "named.<locals>.<lambda> is slow (on the firing idle_gap alert"  in errors[0], errors
    assert hooks.join(10)  # it ends once the hook returns
