"""The input verdict on robust statistics: wait beyond the fetch floor, a few outliers left out."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BATCH, FEATURES, TIMESTEPS, read_run, sequences, stalled_dataset, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.input_share import pipeline_wait_s, robust_share
from rnnmon.analysis.summary import summarize


def test_two_long_waits_do_not_make_a_share():
    wait = np.array([0.018, 0.016] + [0.0003] * 18)
    step = wait + 0.0034
    assert robust_share(pipeline_wait_s(wait, np.ones(20), 0.0003), step) == 0.0
    assert robust_share(wait, step) < 0.1


def test_a_stall_every_step_is_all_share():
    wait = np.full(40, 0.010)
    assert robust_share(pipeline_wait_s(wait, np.ones(40), 0.0005), wait + 0.004) == pytest.approx(0.0095 / 0.014,
                                                                                                       abs=1e-3)


def _summary(tmp_path, model, dataset):
    model.fit(dataset, epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
    return summarize(read_run(str(tmp_path)))


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_stateful_lstm_with_two_early_stalls_is_not_input_bound(tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(batch_shape=(BATCH, TIMESTEPS, FEATURES)),
                              keras.layers.LSTM(16, stateful=True), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    stalls = stalled_dataset(12, lambda batch: 0.04 if batch in (3, 4) else 0.0, prefetch="explicit")
    summary = _summary(tmp_path, model, stalls)
    assert summary["verdict"] != "input-bound", summary["shares"]
    assert "INPUT_BOUND" not in {f["code"] for f in summary["findings"]}
    assert max(read_run(str(tmp_path)).steps[:, 4]) > 10  # the stalls were measured


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_tuned_pipeline_with_small_steps_is_never_input_bound(tmp_path):
    import tensorflow as tf

    x, y = sequences(30)
    model = tiny_model()  # about 2 ms a step here
    verdicts, small_step = [], 0
    for run in range(10):
        dataset = (tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
                   .map(lambda f, t: (f * 1.0, t), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
        summary = _summary(tmp_path / str(run), model, dataset)
        verdicts.append(summary["verdict"])
        codes = {f["code"] for f in summary["findings"]}
        assert "INPUT_BOUND" not in codes, summary["findings"]
        assert summary["fetch_floor_ms"] > 0
        small_step += "SMALL_STEP" in codes
    assert "input-bound" not in verdicts, verdicts


@pytest.mark.usefixtures("no_nvml")
def test_small_step_names_the_floor_and_the_remedy(tmp_path):
    import tensorflow as tf

    x, y = sequences(30)
    dataset = tf.data.Dataset.from_tensor_slices((x[:, :2], y)).batch(BATCH).prefetch(2)  # 2 time steps: tiny
    import keras

    model = keras.Sequential([keras.Input((2, FEATURES)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    summary = _summary(tmp_path, model, dataset)
    [finding] = [f for f in summary["findings"] if f["code"] == "SMALL_STEP"]
    assert f"{summary['fetch_floor_ms']:.2f} ms" in finding["message"]
    assert "steps_per_execution=" in finding["advice"] and finding["speedup"] > 1


def test_of_equal_waits_at_the_cut_the_latest_steps_are_left_out():
    # Waits are whole microseconds, so a long run has thousands of equal waits where the longest 5% are cut off:
    # which of them go decides the share. It is the latest ones (as a stable sort would), on every machine.
    rng = np.random.default_rng(0)
    wait = rng.integers(1, 11, 100_000) / 1e3  # ten distinct waits: ~10,000 steps share the longest
    step = wait + np.linspace(0.001, 0.1, len(wait))  # later steps are longer: leaving out others changes the share
    keep = np.argsort(wait, kind="stable")[:-5000]
    assert robust_share(wait, step) == round(wait[keep].sum() / step[keep].sum(), 4)
