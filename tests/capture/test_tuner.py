"""A monitor in a KerasTuner search: copied for each trial, a run per trial, the trials compared in the report."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import TESTS, read_run, sequences, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed

from rnnmon import UtilizationMonitor
from rnnmon.report import build_report, render_text

SEARCH = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[2])
    import keras_tuner as kt
    import rnnmon
    from conftest import stalled_dataset, tiny_model
    from fake_nvml import library_missing

    class StallSearch(kt.HyperModel):
        def build(self, hp):
            return tiny_model(units=hp.Choice("units", [8, 16]))

        def fit(self, hp, model, **kwargs):  # the trial with stall_ms=20 waits for its input
            data = stalled_dataset(int(sys.argv[4]), hp.Choice("stall_ms", [0, 20]) / 1e3)
            return model.fit(data, **kwargs)

    with library_missing():  # CPU-only mode, also on a machine with a GPU
        tuner = kt.GridSearch(StallSearch(), objective="loss", max_trials=int(sys.argv[5]), directory=sys.argv[3],
                              project_name="stall", overwrite=True)
        tuner.search(epochs=2, verbose=0, callbacks=[rnnmon.UtilizationMonitor(sys.argv[1], audit=False)])
        tiny_model().fit(stalled_dataset(12), verbose=0,  # another monitor in the same process
                         callbacks=[rnnmon.UtilizationMonitor(sys.argv[1] + "-plain", audit=False)])
    print(json.dumps({t.trial_id: t.hyperparameters.values for t in tuner.oracle.trials.values()}))
""")


@pytest.mark.slow  # a search of four trials in a process of its own: 15-20 s
def test_search_writes_a_run_per_trial_and_the_report_compares_them(tmp_path):
    pytest.importorskip("keras_tuner")
    logdir = tmp_path / "logs"
    trials, stderr = _search(tmp_path, batches=30, trials=4)
    assert len(trials) == 4
    assert stderr.count("CPU-only mode") == 1, stderr[-3000:]  # once per process, not per trial/monitor

    assert sorted(p.name for p in logdir.iterdir()) == sorted(f"trial_{t}" for t in trials)
    for trial_id, values in trials.items():
        run = read_run(str(logdir), f"trial_{trial_id}/rnnmon")
        assert run.info["trial"] == {"id": trial_id, "search": "stall", "hyperparameters": values}
        assert run.fits == 1 and len(run.steps) == 60 and run.info["status"] == "finished"

    report = build_report(str(logdir))
    [group] = report["trials"]
    assert group["search"] == "stall" and [row["trial"] for row in group["trials"]] == sorted(trials)
    stalled = sorted(t for t, values in trials.items() if values["stall_ms"] == 20)
    assert group["input_bound"] == stalled
    assert group["fastest"] not in stalled and group["slowest"] in stalled
    assert group["speedup"] > 2  # a 20 ms wait on a ~2 ms step
    assert group["caveat"] is None  # 59 steps a trial after its warm-up
    text = render_text(report)
    assert "Trials of search stall (4)" in text
    assert f"input-bound: {', '.join(f'trial {t}' for t in stalled)}" in text
    assert f"fastest: trial {group['fastest']}, {group['speedup']:.2f}x less time per epoch" in text


@pytest.mark.slow  # a search of two trials in a process of its own: ~10 s
def test_a_search_of_short_trials_is_ranked_with_a_caveat(tmp_path):
    """Issue 26: a Hyperband search was ranked on 11-step trials with no caveat."""
    pytest.importorskip("keras_tuner")
    trials, _ = _search(tmp_path, batches=6, trials=2)  # 2 epochs of 6 batches: 11 steps after the warm-up
    [group] = build_report(str(tmp_path / "logs"))["trials"]
    assert [row["steps"] for row in group["trials"]] == [11, 11]
    assert group["fastest"] is not None
    names = ", ".join(f"trial {t} (11)" for t in sorted(trials))
    assert group["caveat"].startswith(f"ranked on too few steps: {names} ran fewer than 50 steps after warm-up")
    assert f"caveat: {group['caveat']}" in render_text(build_report(str(tmp_path / "logs")))


def _search(tmp_path, *, batches: int, trials: int) -> tuple[dict, str]:
    """Runs SEARCH into tmp_path/logs: the trials' hyperparameters by id, and the process's stderr."""
    result = subprocess.run([sys.executable, "-c", SEARCH, str(tmp_path / "logs"), TESTS, str(tmp_path / "tuner"),
                             str(batches), str(trials)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.usefixtures("no_nvml")
def test_a_copy_is_a_fresh_monitor_with_the_same_settings(tmp_path, traced_model):
    alerts = []
    monitor = UtilizationMonitor(str(tmp_path), sample_interval_s=0.2, flush_secs=1.0, audit=False,
                                 on_alert=alerts.append, thresholds={"gpu_util_low": {"for_s": 3.0}})
    model = traced_model
    x, y = sequences(12)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor])
    twin = copy.deepcopy(monitor)
    assert twin is not monitor and twin.model is None and twin._run is None
    assert (twin.log_dir, twin.sample_interval_s, twin.flush_secs, twin.audit) == (str(tmp_path), 0.2, 1.0, False)
    assert twin.thresholds == monitor.thresholds and twin.on_alert == alerts.append  # the same list, not a copy
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[twin])
    run = read_run(str(tmp_path))
    assert run.fits == 2 and len(run.steps) == 24 and run.info["status"] == "finished"


@pytest.mark.slow
def test_copies_sample_the_gpu_and_warn_about_a_device_once(tmp_path, rnnmon_warnings):
    lib = FakeNvmlLib([FakeGpu(utilization=60.0)], unsupported={"nvmlDeviceGetPowerUsage"})
    monitor = UtilizationMonitor(str(tmp_path), sample_interval_s=0.1, audit=False)
    x, y = sequences(12)
    with installed(lib):
        for trial in (monitor, copy.deepcopy(monitor), copy.deepcopy(monitor)):  # as KerasTuner's trials
            tiny_model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[trial])
    warnings = rnnmon_warnings()
    assert sum("power is unavailable on GPU 0" in w for w in warnings) == 1, warnings  # not once per copy
    run = read_run(str(tmp_path))
    assert run.fits == 3 and len(run.util[0]) >= 3
