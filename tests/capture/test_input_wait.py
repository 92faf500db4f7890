"""Input wait measured on real Keras fits against stalls injected into the tf.data pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BATCH, read_run, sequences, stalled_dataset, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize

STEPS = 40


def _fit_and_read(tmp_path, dataset, model=None, **monitor_args):
    model = model or tiny_model()
    model.fit(dataset, epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path), **monitor_args)])
    run = read_run(str(tmp_path))
    steady = run.steps[~np.isnan(run.steps[:, 5])]  # leave out the warm-up step
    wait_ms = np.median(steady[:, 4])
    compute_ms = np.median((steady[:, 3] - steady[:, 2]) * 1e3 - steady[:, 4])
    return run, wait_ms, compute_ms


@pytest.fixture(scope="module")
def pipeline_ms(tmp_path_factory, no_nvml_module):
    """What the same pipeline costs per batch without a stall and without prefetch."""
    _, wait_ms, _ = _fit_and_read(tmp_path_factory.mktemp("baseline"), stalled_dataset(STEPS, 0.0, prefetch="none"))
    return wait_ms


@pytest.fixture(scope="module")
def no_nvml_module():
    from fake_nvml import library_missing

    with library_missing():
        yield


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize("stall_ms", [5, 20])
@pytest.mark.parametrize("prefetch", ["none", "injected", "explicit"])
def test_measured_wait_matches_injected_stall(tmp_path, stall_ms, prefetch, pipeline_ms):
    run, wait_ms, compute_ms = _fit_and_read(tmp_path, stalled_dataset(STEPS, stall_ms / 1e3, prefetch=prefetch))
    # A prefetch buffer lets the pipeline work while the step computes, so the step waits for the rest.
    # When the step outlasts the stall the pipeline keeps up and the step waits for nothing (a slow machine's
    # 7 ms step against a 5 ms stall).
    expected = max(0.0, pipeline_ms + stall_ms - (0.0 if prefetch == "none" else compute_ms))
    assert abs(wait_ms - expected) <= 0.15 * stall_ms + 0.5, (wait_ms, expected, pipeline_ms, compute_ms)
    assert run.steps.shape[0] == STEPS


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_no_stall_means_small_input_wait(tmp_path):
    import tensorflow as tf

    # Fetching a ready batch still costs ~0.3 ms here (an eager op), more than the floor measured back to back
    # after a pause, so use a step that is not tiny: a 5 ms "device" wait, which a loaded CPU does not stretch
    # (with compute alone the share reached 0.104 in a full suite beside two other fits).
    x, y = sequences(STEPS)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(2)
    run, _, _ = _fit_and_read(tmp_path, dataset, model=tiny_model(units=128, device_s=0.005))
    summary = summarize(run)
    assert summary["input_wait_fraction"] < 0.1
    assert summary["verdict"] != "input-bound"


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_stall_makes_the_run_input_bound(tmp_path):
    run, _, _ = _fit_and_read(tmp_path, stalled_dataset(STEPS, 0.02, prefetch="none"))
    summary = summarize(run)
    assert summary["verdict"] == "input-bound"
    assert summary["input_wait_fraction"] > 0.5


@pytest.mark.usefixtures("no_nvml")
def test_steps_per_execution_above_one_keeps_the_graph_loop_by_default(tmp_path):
    model = tiny_model(steps_per_execution=4)
    model.fit(stalled_dataset(16), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
    run = read_run(str(tmp_path))
    assert not hasattr(model.train_function, "__rnnmon_original__")
    assert np.isnan(run.steps[:, 4]).all()
    assert run.steps[:, 6].tolist() == [4.0] * 4 and run.steps[-1, 0] == 16
    assert run.info["input_wait"] == "not measured: steps_per_execution=4"
    assert summarize(run)["input_wait_ms"] is None


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_steps_per_execution_above_one_measures_when_asked(tmp_path, pipeline_ms):
    model = tiny_model(steps_per_execution=4)
    monitor = UtilizationMonitor(str(tmp_path), measure_input_wait=True)
    model.fit(stalled_dataset(16, 0.005, prefetch="none"), epochs=1, verbose=0, callbacks=[monitor])
    run = read_run(str(tmp_path))
    expected = 4 * (5.0 + pipeline_ms)  # four batches pulled per execution
    assert np.all(np.abs(run.steps[1:, 4] - expected) <= 0.15 * expected + 4 * 0.5), (run.steps[1:, 4], expected)
