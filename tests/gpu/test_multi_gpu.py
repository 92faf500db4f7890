"""Several GPUs in one process: MirroredStrategy over two logical CPUs, watched through a fake NVML of two GPUs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import TESTS, read_run

from rnnmon.analysis.imbalance import device_imbalance
from rnnmon.analysis.summary import summarize
from rnnmon.findings import amdahl
from rnnmon.report import build_report, render_text

WORKER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras, rnnmon
    from conftest import stalled_dataset
    from fake_nvml import FakeGpu, FakeNvmlLib, installed

    # GPU 0 computes throughout; GPU 1 finishes its share early and idles half of every 0.4 s.
    busy = FakeGpu(utilization=90.0, pids=[os.getpid()])
    waiting = FakeGpu(utilization=lambda t: 0.0 if t % 0.4 < 0.2 else 90.0, pids=[os.getpid()])
    with installed(FakeNvmlLib([busy, waiting], sample_period_s=0.05)):
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse")
        monitor = rnnmon.UtilizationMonitor(sys.argv[1], devices=[0, 1], audit=False, sample_interval_s=0.1,
                                            flush_secs=0.5)
        model.fit(stalled_dataset(150, 0.012), epochs=1, verbose=0, callbacks=[monitor])
""")


@pytest.mark.slow
def test_mirrored_strategy_gets_a_row_per_gpu_and_the_idle_one_is_flagged(tmp_path):
    tests = TESTS
    result = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), tests], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run = read_run(str(tmp_path))
    assert sorted(run.util) == [0, 1] and len(run.steps) == 150

    from rnnmon_tensorboard.timeline import build_timeline

    assert [gpu["index"] for gpu in build_timeline(run, None, None, 1000)["gpus"]] == [0, 1]
    summary = summarize(run)
    gpu0, gpu1 = summary["gpus"]
    assert gpu0["idle_fraction"] < 0.1 and 0.3 < gpu1["idle_fraction"] < 0.7, summary["gpus"]
    assert gpu1["idle_by_cause_s"]["sync"] > 0.5 * sum(gpu1["idle_by_cause_s"].values()), gpu1
    assert gpu1["idle_by_cause_s"]["input"] == 0  # GPU 0 computed meanwhile: a wait for the replica, not input
    imbalance = [f for f in summary["findings"] if f["code"] == "DEVICE_IMBALANCE"]
    assert len(imbalance) == 1 and imbalance[0]["where"] == "GPU 1", summary["findings"]
    assert "GPU 0 idle 0%" in imbalance[0]["message"] and "waits for GPU 0" in imbalance[0]["message"]
    # What balancing can remove is GPU 1's wait for GPU 0: its sync idle time as a share of step time.
    step_s = summary["wall_s"] * (1 - summary["eval_fraction"] - summary["epoch_end_fraction"])
    assert imbalance[0]["speedup"] == amdahl(gpu1["idle_by_cause_s"]["sync"] / step_s) > 1.2, imbalance[0]
    assert f"up to {imbalance[0]['speedup']:.2f}x shorter steps" in imbalance[0]["message"]
    text = render_text(build_report(str(tmp_path)))
    assert "  GPU 0 " in text and "  GPU 1 " in text and "waiting for other GPUs" in text


def _gpu(index, util_mean, idle_fraction, sync_s):
    return {"index": index, "util_mean": util_mean, "idle_fraction": idle_fraction,
            "idle_by_cause_s": {"sync": sync_s, "input": 0.0}}


def test_imbalance_bound_is_the_share_of_step_time_the_idle_gpu_waits_for_the_other():
    summary = {"verdict": "compute-bound", "wall_s": 100.0, "eval_fraction": 0.1, "epoch_end_fraction": 0.1,
               "gpus": [_gpu(0, 90.0, 0.02, 0.0), _gpu(1, 50.0, 0.45, 40.0)]}
    (finding,) = device_imbalance(summary)
    assert finding.where == "GPU 1" and finding.speedup == 2.0  # 40 s of 80 s of steps: 1 / (1 - 0.5)
    assert "up to 2.00x shorter steps" in finding.message


def test_imbalance_without_a_measured_wait_promises_no_speedup():
    summary = {"verdict": "compute-bound", "wall_s": 100.0, "eval_fraction": 0.0, "epoch_end_fraction": 0.0,
               "gpus": [_gpu(0, 90.0, 0.02, 0.0), _gpu(1, 10.0, 0.9, 0.0)]}  # e.g. a GPU the model does not use
    (finding,) = device_imbalance(summary)
    assert finding.speedup is None and "promises no speed-up" in finding.message
