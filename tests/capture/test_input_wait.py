"""Input wait measured on real Keras fits against stalls injected into the tf.data pipeline."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import BATCH, read_run, sequences, stalled_dataset, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize
from rnnmon.report import build_report, render_text

STEPS = 40
SAMPLED = 8 * (2 + 16 * 3)  # steps_per_execution=8: the warm-up, then executions 1, 17, 33 and 49 timed


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
def test_steps_per_execution_above_one_times_a_sample_of_executions_by_default(tmp_path, traced_models):
    model = traced_models(steps_per_execution=2)
    model.fit(stalled_dataset(2 * 17 + 1), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
    run = read_run(str(tmp_path))
    timed = ~np.isnan(run.steps[:, 4])
    # The warm-up execution, the first after it, then every 16th: the others ran Keras's in-graph loop untimed.
    assert np.flatnonzero(timed).tolist() == [0, 1, 17]
    # The last, timed, found one batch where it asked for two: the iterator that ran out fetched none.
    assert run.steps[:, 6].tolist() == [2.0] * 17 + [1.0] and run.steps[-1, 0] == 35
    assert run.info["input_wait"] == "sampled: 1 execution in 16"
    summary = summarize(run)
    assert summary["input_wait_ms"]["median"] > 0 and summary["input_wait_coverage"] == 0.0909  # 3 of 33 batches


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_steps_per_execution_above_one_measures_when_asked(tmp_path, pipeline_ms):
    model = tiny_model(steps_per_execution=4)
    monitor = UtilizationMonitor(str(tmp_path), measure_input_wait=True)
    model.fit(stalled_dataset(16, 0.005, prefetch="none"), epochs=1, verbose=0, callbacks=[monitor])
    run = read_run(str(tmp_path))
    expected = 4 * (5.0 + pipeline_ms)  # four batches pulled per execution
    assert np.all(np.abs(run.steps[1:, 4] - expected) <= 0.15 * expected + 4 * 0.5), (run.steps[1:, 4], expected)


def _generator(batches: int, stall_s: float):
    """`batches` batches from a Python generator that sleeps `stall_s` before each."""
    x, y = sequences(batches)
    for i in range(batches):
        time.sleep(stall_s)
        yield x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_steps_per_execution_8_with_a_stall_per_batch_is_input_bound_on_a_sample(tmp_path, pipeline_ms):
    run, _, _ = _fit_and_read(tmp_path, stalled_dataset(SAMPLED, 0.01, prefetch="none"),
                              model=tiny_model(steps_per_execution=8))
    summary = summarize(run)
    assert summary["verdict"] == "input-bound", summary["summary"]
    assert summary["input_wait_coverage"] < 0.1 and "timed on a sample" in summary["summary"]
    # Without prefetch each batch waits for its stall and the pipeline's own cost.
    assert abs(summary["input_wait_ms"]["median"] - (10.0 + pipeline_ms)) <= 0.25 * 10.0, summary["input_wait_ms"]
    text = render_text(build_report(str(tmp_path)))
    assert "of the batches: sampled: 1 execution in 16)" in text and "INPUT_BOUND" in text


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_steps_per_execution_8_with_a_stalling_generator_is_input_bound(tmp_path):
    model = tiny_model(steps_per_execution=8)
    model.fit(_generator(SAMPLED, 0.01), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
    summary = summarize(read_run(str(tmp_path)))
    assert summary["verdict"] == "input-bound", summary["summary"]
    # Keras prefetches a generator's batches: each waits for its stall less the step it overlapped.
    assert 3.0 <= summary["input_wait_ms"]["median"] <= 12.5, summary["input_wait_ms"]


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_steps_per_execution_8_without_a_stall_is_not_input_bound(tmp_path):
    import tensorflow as tf

    x, y = sequences(SAMPLED)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(2)
    run, _, _ = _fit_and_read(tmp_path, dataset, model=tiny_model(units=128, device_s=0.005, steps_per_execution=8))
    summary = summarize(run)
    assert summary["input_wait_coverage"] < 0.1
    assert summary["verdict"] != "input-bound" and summary["shares"]["input"] < 0.1, summary["summary"]


@pytest.mark.usefixtures("no_nvml")
def test_a_verdict_without_input_wait_says_so_and_how_to_measure_it(tmp_path, traced_models):
    model = traced_models(steps_per_execution=2)
    monitor = UtilizationMonitor(str(tmp_path), measure_input_wait=False)
    model.fit(stalled_dataset(2 * 12), epochs=1, verbose=0, callbacks=[monitor])
    summary = summarize(read_run(str(tmp_path)))
    assert summary["input_wait_coverage"] is None and summary["shares"]["input"] is None
    assert summary["verdict_note"].startswith("Input wait was not measured (measure_input_wait=False)")
    assert "drop `measure_input_wait=False`" in summary["summary"] and "input and host" not in summary["summary"]
