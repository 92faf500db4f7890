"""Alerts on real fits: thresholds in the callback, hooks, stopping, profiling, and a thresholds file."""

from __future__ import annotations

import glob
import json
import os
import threading
import time

import keras
import numpy as np
import pytest
from conftest import read_run, stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed
from idle_windows import IdleWindows

from rnnmon import UtilizationMonitor
from rnnmon.alerts.thresholds import Thresholds
from rnnmon.alerts.thresholds_file import THRESHOLDS_FILE, save_thresholds_file
from rnnmon.analysis.summary import summarize
from rnnmon.format.schema import PHASE_KINDS, STEP_COLUMNS

FAST = {"gpu_util_low": {"pct": 20.0, "resolve_pct": 30.0, "for_s": 0.5}}


def _dip_at(index: int, seconds: float, windows: IdleWindows):
    def delay(batch: int) -> float:
        if batch == index:
            windows.open()
            time.sleep(seconds)
            windows.close()
        return 0.005

    return delay


def _dip_until_alerted(index: int, seconds: float, windows: IdleWindows, alerted: threading.Event):
    """`_dip_at`, then each batch waits (up to 30 s in all) until an alert fired: under load the writer thread
    judges the dip seconds later, and a fit that ended meanwhile would have no step left to act on the alert."""
    dip, deadline = _dip_at(index, seconds, windows), []

    def delay(batch: int) -> float:
        if batch > index and not alerted.is_set():
            deadline.append(deadline[0] if deadline else time.monotonic() + 30)
            alerted.wait(max(0.0, min(0.05, deadline[-1] - time.monotonic())))
        return dip(batch)

    return delay


@pytest.mark.slow
def test_alert_fires_resolves_and_reaches_hook_log_and_report(tmp_path, caplog):
    windows, events = IdleWindows(), []
    gpu = FakeGpu(utilization=windows.utilization, pids=[os.getpid()])
    with installed(FakeNvmlLib([gpu])):
        tiny_model().fit(stalled_dataset(200, _dip_at(60, 2.0, windows)), epochs=1, verbose=0,
                         callbacks=[UtilizationMonitor(str(tmp_path), thresholds=FAST, on_alert=events.append,
                                                       audit=False)])
    fired = [e for e in events if e.rule == "gpu_util_low"]
    assert [e.state for e in fired] == ["firing", "resolved"]
    (start, end), = windows.windows
    assert start < fired[0].start < end and start + 0.4 < fired[1].end < end + 1.0
    assert any("rnnmon alert gpu_util_low (GPU 0)" in r.getMessage() for r in caplog.records)
    alerts = summarize(read_run(str(tmp_path)))["alerts"]
    alert = next(a for a in alerts if a["rule"] == "gpu_util_low")
    assert {"rule", "device", "start", "end", "value", "threshold"} <= set(alert)
    assert alert["device"] == 0 and alert["end"] is not None and alert["value"] < 20


@pytest.mark.slow
def test_stop_on_alert_ends_training_early(tmp_path):
    windows = IdleWindows()
    with installed(FakeNvmlLib([FakeGpu(utilization=windows.utilization, pids=[os.getpid()])])):
        model = tiny_model()
        model.fit(stalled_dataset(400, _dip_at(30, 3.0, windows)), epochs=1, verbose=0,
                  callbacks=[UtilizationMonitor(str(tmp_path), thresholds=FAST, stop_on_alert=["gpu_util_low"],
                                                audit=False, flush_secs=0.5)])
    run = read_run(str(tmp_path))
    # Alerts are judged at each flush: one lands 0.5-1.5 s into the 3 s dip, while the 31st step waits for batch
    # 30, and the fit ends with that step.
    assert len(run.steps) == 31 and run.info["status"] == "finished", (len(run.steps), run.info.get("status"))
    assert "gpu_util_low" in {alert["rule"] for alert in summarize(run)["alerts"]}


@pytest.mark.slow
def test_profile_is_captured_after_an_alert(tmp_path):
    windows, alerted = IdleWindows(), threading.Event()
    with installed(FakeNvmlLib([FakeGpu(utilization=windows.utilization, pids=[os.getpid()])])):
        tiny_model().fit(stalled_dataset(300, _dip_until_alerted(30, 2.0, windows, alerted)), epochs=1, verbose=0,
                         callbacks=[UtilizationMonitor(str(tmp_path), thresholds=FAST, profile_steps_on_alert=5,
                                                       on_alert=lambda _: alerted.set(), audit=False)])
    traces = glob.glob(str(tmp_path / "rnnmon" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(traces) == 1 and os.path.getsize(traces[0]) > 0
    # Its start and its stop-and-save are profile phases, each the whole gap between two steps: five steps apart
    run = read_run(str(tmp_path))
    phases = run.phases[run.phases[:, 0] == PHASE_KINDS.index("profile")]
    begin, step = run.steps[:, STEP_COLUMNS.index("begin")], run.steps[:, STEP_COLUMNS.index("step")]
    [first], [after] = (np.flatnonzero(np.isclose(begin, end, rtol=0, atol=1e-5)) for end in phases[:, 2])
    assert len(phases) == 2 and step[after] - step[first] == 5, run.phases
    assert (run.steps[[first, after], STEP_COLUMNS.index("host_gap_ms")] == 0).all()
    assert summarize(run)["time_s"]["profiling"] == pytest.approx(float((phases[:, 2] - phases[:, 1]).sum()),
                                                                  abs=1e-3)


@pytest.mark.parametrize(("thresholds", "words"), [
    ({"gpu_util_low": {"pct": 150}}, "gpu_util_low.pct must be in [0, 100]. Received: 150"),
    ({"gpu_utl_low": {}}, "Unknown key(s) in thresholds: gpu_utl_low"),
    ({"idle_gap": {"min_s": "ten"}}, "idle_gap.min_s must be a finite number"),
])
def test_invalid_thresholds_are_rejected_by_name(thresholds, words):
    with pytest.raises(ValueError) as error:
        UtilizationMonitor("logs", thresholds=thresholds)
    assert words in str(error.value)


def test_unknown_stop_rule_is_rejected():
    with pytest.raises(ValueError, match="Received: stop_on_alert="):
        UtilizationMonitor("logs", stop_on_alert=["gpu_too_hot"])


class SaveThresholds(keras.callbacks.Callback):
    """Saves `thresholds` at `path` once steps have run `after_s` seconds (as the tab does while a fit runs), and
    stops the fit `give_up_s` later if nothing else has."""

    def __init__(self, path, thresholds: Thresholds, after_s: float, give_up_s: float = 30.0) -> None:
        super().__init__()
        self.path, self.thresholds, self.after_s, self.give_up_s = path, thresholds, after_s, give_up_s
        self.began = self.saved_at = self.ended_at = None
        self.gave_up = False

    def on_train_batch_end(self, batch, logs=None):
        now = time.monotonic()
        self.began = self.began or now
        if self.saved_at is None and now - self.began >= self.after_s:
            save_thresholds_file(self.path, self.thresholds)
            self.saved_at = now
        elif self.saved_at is not None and now - self.saved_at > self.give_up_s:
            self.gave_up = self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.ended_at = time.monotonic()


@pytest.mark.slow
def test_thresholds_file_reaches_a_running_fit(tmp_path, caplog):
    """At 60% utilization nothing fires, until a saved file raises the bar to 80%: the fit then stops itself."""
    run_dir = tmp_path / "exp"
    raised = Thresholds.from_dict({"gpu_util_low": {"pct": 80.0, "resolve_pct": 85.0, "for_s": 1.0}})
    saver = SaveThresholds(tmp_path / THRESHOLDS_FILE, raised, after_s=1.5)  # one folder above the run, as the tab
    with installed(FakeNvmlLib([FakeGpu(utilization=60.0, pids=[os.getpid()])])):
        tiny_model().fit(stalled_dataset(10_000, 0.005), epochs=1, verbose=0, callbacks=[
            UtilizationMonitor(str(run_dir), thresholds={"gpu_util_low": {"for_s": 1.0}}, stop_on_alert=True,
                               audit=False, flush_secs=0.5), saver])
    assert saver.saved_at is not None and not saver.gave_up  # stopped by the alert, not by the test's limit
    assert saver.ended_at - saver.saved_at < 10
    messages = [r.getMessage() for r in caplog.records if r.name == "rnnmon"]
    assert any("alert thresholds now come from" in m for m in messages)
    assert any("rnnmon alert gpu_util_low" in m for m in messages)
    run = read_run(str(run_dir))
    alerts = summarize(run)["alerts"]
    # no alert at the callback's 20% during the 1.5 s (three flushes, each judging a whole 1 s window) before
    assert {a["threshold"] for a in alerts if a["rule"] == "gpu_util_low"} == {80.0}
    assert run.info["status"] == "finished"
    assert run.info["thresholds"]["gpu_util_low"]["pct"] == 80.0
    assert run.info["thresholds_source"].endswith(THRESHOLDS_FILE)
    assert json.loads((tmp_path / THRESHOLDS_FILE).read_text())["gpu_util_low"]["pct"] == 80.0


def test_run_description_records_the_thresholds_in_effect(tmp_path, traced_model):
    custom = {"gpu_util_low": {"pct": 12.0, "resolve_pct": 30.0, "for_s": 5.0}}
    traced_model.fit(stalled_dataset(12), epochs=1, verbose=0,
                     callbacks=[UtilizationMonitor(str(tmp_path), thresholds=custom, audit=False)])
    info = read_run(str(tmp_path)).info
    assert info["thresholds_source"] == "callback" and info["thresholds"]["gpu_util_low"]["pct"] == 12.0


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_thresholds_picked_up_on_a_flush_without_steps_reach_the_run_description(tmp_path, caplog):
    """The file is saved while the input pipeline stalls, after every earlier step is on disk: the flushes that
    see it hold no step (this used to switch the rules but keep the old thresholds in the run description, and
    leave the alert they had fired open for ever)."""
    batches, path = [0], tmp_path / THRESHOLDS_FILE
    quiet = Thresholds.from_dict({"input_wait_high": {"enabled": False}})

    def on_disk() -> bool:
        run = read_run(str(tmp_path))
        return len(run.steps) == batches[0] and bool(run.alerts)

    def until(condition, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stall(batch: int) -> float:
        if batch == 30:  # training waits here for the next batch
            until(on_disk)
            save_thresholds_file(path, quiet)
            until(lambda: any("alert thresholds now come from" in r.getMessage() for r in caplog.records))
        return 0.01

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches[0] += 1

    thresholds = {"input_wait_high": {"pct": 5, "resolve_pct": 2, "for_s": 0.1}}  # fires on the first steps
    tiny_model().fit(stalled_dataset(40, stall, prefetch="none"), epochs=1, verbose=0, callbacks=[
        UtilizationMonitor(str(tmp_path), thresholds=thresholds, flush_secs=0.2, audit=False), Count()])
    run = read_run(str(tmp_path))
    assert len(run.steps) == 40 and run.info["status"] == "finished"
    assert run.info["thresholds"]["input_wait_high"]["enabled"] is False
    assert run.info["thresholds_source"] == str(path)
    alerts = [a for a in run.alerts if a["rule"] == "input_wait_high"]
    states = [(a["state"], a["message"].split(" (")[0]) for a in alerts]
    assert states[0][0] == "firing" and states[1:] == [("resolved", "Thresholds changed")], states
    assert abs(alerts[1]["end"] - run.steps[29, 3]) < 0.01  # at the last step the old thresholds judged


@pytest.mark.slow
def test_input_wait_alert_from_an_injected_stall(tmp_path):
    events = []
    thresholds = {"input_wait_high": {"pct": 20.0, "resolve_pct": 10.0, "for_s": 0.3}}

    def delay(batch: int) -> float:
        return 0.03 if 20 <= batch < 40 else 0.0  # the pipeline stalls for 20 steps, then recovers

    # Each step also waits 20 ms for a "device", as for a GPU: unstalled, fetching a batch without prefetch
    # (~0.5 ms) is 2-5% of the step, under the 10% that resolves. On the 3 ms CPU-only step it was 15-20%, between
    # resolve and fire: the alert stayed open until the end of the fit closed it, or flapped with the load.
    tiny_model(device_s=0.02).fit(stalled_dataset(70, delay, prefetch="none"), epochs=1, verbose=0,
                                  callbacks=[UtilizationMonitor(str(tmp_path), thresholds=thresholds,
                                                                on_alert=events.append, audit=False)])
    alerts = [e for e in events if e.rule == "input_wait_high"]
    assert [e.state for e in alerts] == ["firing", "resolved"], [e.message for e in alerts]
    assert "prefetch" in alerts[0].message and alerts[0].value > 20
    assert alerts[1].message.startswith("Resolved: "), alerts[1].message  # recovered, not closed by the fit's end


@pytest.mark.slow
def test_profile_capture_yields_to_a_running_profiler(tmp_path, caplog):
    import tensorflow as tf

    windows, alerted = IdleWindows(), threading.Event()
    tf.profiler.experimental.start(str(tmp_path / "theirs"))  # as TensorBoard(profile_batch=...) would
    try:
        with installed(FakeNvmlLib([FakeGpu(utilization=windows.utilization, pids=[os.getpid()])])):
            history = tiny_model().fit(
                stalled_dataset(150, _dip_until_alerted(30, 1.5, windows, alerted)), epochs=1, verbose=0,
                callbacks=[UtilizationMonitor(str(tmp_path / "ours"), thresholds=FAST, profile_steps_on_alert=5,
                                              on_alert=lambda _: alerted.set(), audit=False)])
    finally:
        tf.profiler.experimental.stop()
    assert len(history.history["loss"]) == 1
    assert any("could not start a profiler trace" in r.getMessage() for r in caplog.records)
    assert not glob.glob(str(tmp_path / "ours" / "rnnmon" / "plugins" / "profile" / "*" / "*.xplane.pb"))
