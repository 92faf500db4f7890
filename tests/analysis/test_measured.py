"""Findings end to end: real fits with the callback, read back through the report's summaries."""

from __future__ import annotations

import os
import time

import keras
import pytest
from conftest import BATCH, read_run, sequences, stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed, library_missing
from idle_windows import IdleWindows, MarkEvaluation

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize


def _codes(tmp_path, fit_args, *, gpu=None, callbacks=(), model=None, **monitor_args):
    with installed(FakeNvmlLib([gpu])) if gpu else library_missing():
        (model or tiny_model()).fit(**fit_args, epochs=1, verbose=0,
                                    callbacks=[UtilizationMonitor(str(tmp_path), **monitor_args), *callbacks])
    summary = summarize(read_run(str(tmp_path)))
    return {f["code"] for f in summary["findings"]}, summary


def _fast_data(batches=40):
    import tensorflow as tf

    x, y = sequences(batches)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(2)


class SlowAfterEachStep(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.004)


@pytest.mark.slow
def test_input_bound_and_its_pipeline_findings(tmp_path):
    codes, summary = _codes(tmp_path, {"x": stalled_dataset(30, 0.02, prefetch="none")})
    assert {"INPUT_BOUND", "PIPELINE_PY_FUNCTION", "PIPELINE_SERIAL_MAP"} <= codes
    finding = next(f for f in summary["findings"] if f["code"] == "INPUT_BOUND")
    assert finding["severity"] == "critical" and "% of step time" in finding["message"]


@pytest.mark.slow
def test_fast_pipeline_has_no_input_findings(tmp_path):
    codes, summary = _codes(tmp_path, {"x": _fast_data()}, model=tiny_model(units=128))
    assert not {c for c in codes if c.startswith(("INPUT", "PIPELINE"))}, summary["findings"]
    assert summary["summary"].startswith("The steps keep the device busy")


@pytest.mark.slow
def test_host_bound_with_a_slow_callback(tmp_path):
    codes, summary = _codes(tmp_path, {"x": _fast_data()}, callbacks=[SlowAfterEachStep()])
    assert "HOST_BOUND" in codes and summary["verdict"] == "host-bound"


@pytest.mark.slow
def test_not_host_bound_without_it(tmp_path):
    codes, _ = _codes(tmp_path, {"x": _fast_data()}, model=tiny_model(units=128))
    assert "HOST_BOUND" not in codes


@pytest.mark.slow
@pytest.mark.parametrize(("util", "expected"), [(30.0, True), (95.0, False)])
def test_low_work_per_step_from_gpu_utilization(tmp_path, util, expected):
    gpu = FakeGpu(utilization=util, sm_util_pct=util, pids=[os.getpid()])
    codes, summary = _codes(tmp_path, {"x": _fast_data(150)}, gpu=gpu, model=tiny_model(units=128), audit=False)
    assert ("LOW_WORK_PER_STEP" in codes) is expected
    if expected:  # filling the 70% of SM time left unused: the steps' time at 30% of it
        finding = next(f for f in summary["findings"] if f["code"] == "LOW_WORK_PER_STEP")
        times = summary["time_s"]
        without = times["training"] - times["steps"] * (1 - util / 100)
        assert finding["speedup"] == pytest.approx(times["training"] / without, rel=0.01), finding
        assert f"this fit would take {without:.1f} s instead of {times['training']:.1f} s" in finding["message"]


@pytest.mark.slow
@pytest.mark.parametrize("idle_during_eval", [True, False])
def test_eval_idle_when_the_gpu_waits_through_validation(tmp_path, idle_during_eval):
    windows = IdleWindows()
    gpu = FakeGpu(utilization=windows.utilization if idle_during_eval else 90.0, pids=[os.getpid()])
    codes, _ = _codes(tmp_path, {"x": _fast_data(60), "validation_data": stalled_dataset(40, 0.02)}, gpu=gpu,
                      callbacks=[MarkEvaluation(windows)], audit=False)
    assert ("EVAL_IDLE" in codes) is idle_during_eval


def test_tensorflow_without_gpu_support_is_flagged_when_nvml_sees_a_gpu(tmp_path, traced_model):
    codes, summary = _codes(tmp_path, {"x": _fast_data(12)}, gpu=FakeGpu(), model=traced_model)
    assert "TF_NO_GPU" in codes  # this test suite runs tensorflow-cpu
    assert next(f for f in summary["findings"] if f["code"] == "TF_NO_GPU")["severity"] == "critical"


@pytest.mark.slow
def test_no_placement_finding_without_nvml(tmp_path):
    codes, _ = _codes(tmp_path, {"x": _fast_data(12)})
    assert not codes & {"TF_NO_GPU", "PROCESS_NOT_ON_GPU"}


@pytest.mark.slow
@pytest.mark.parametrize(("layer_args", "flagged"), [({"recurrent_dropout": 0.2}, True), ({}, False)])
def test_rnn_fast_path_findings_reach_the_report(tmp_path, layer_args, flagged):
    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(8, name="encoder", **layer_args),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    codes, summary = _codes(tmp_path, {"x": _fast_data(12)}, model=model)
    assert ("RNN_NO_FAST_KERNEL" in codes) is flagged
    if flagged:
        finding = next(f for f in summary["findings"] if f["code"] == "RNN_NO_FAST_KERNEL")
        assert finding["where"] == "encoder" and "recurrent_dropout" in finding["message"]
