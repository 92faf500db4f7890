"""What the findings predict holds: real fits with and without a cause, the fit's training time predicted without the
cause against the training time of the fits without it.

Every measured finding predicts one quantity: the fit's training time (its wall time after the warm-up) without
its cause (`training_without_s`). On a shared 2-core machine a step's compute varies with the load by more than the
25% checked here, so the two arms alternate in short fits of models traced once, each fit a run of its own, and
predicted and achieved are medians over the rounds: both arms see the same load. The models also wait 10 ms per
step for a "device" (as the host waits for a GPU's compute), so that the CPU-bound part, which the load moves
most, is not all of the step. The checks are tight enough that a predictor of the median step (the old one: 3.6x
for the stall below, where the fit gains 1.7x) fails them.
"""

from __future__ import annotations

import statistics
import time

import keras
import pytest
from conftest import BATCH, read_run, sequences, stalled_dataset, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize

pytestmark = pytest.mark.slow  # rounds of alternating fits: 20-40 s a test

ROUNDS = 4


class SlowEveryFifthStep(keras.callbacks.Callback):
    """Host work on a fifth of the steps (logging, a checkpoint): slow steps that have nothing to do with input."""

    def on_train_batch_end(self, batch, logs=None):
        if batch % 5 == 4:
            time.sleep(0.1)


class Logs15ms(keras.callbacks.Callback):
    """A 15 ms call after every step (a remote logger)."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.015)


def _alternate(tmp_path, arms: dict, steps: int) -> dict[str, list[dict]]:
    """{name: [summary of each fit]} after ROUNDS rounds of one fit per arm (alternating the order), each fit a run
    of its own; `arms` maps name -> (model, make_data, callbacks before the monitor, callbacks after it)."""
    summaries: dict[str, list[dict]] = {name: [] for name in arms}
    for model, make_data, _, _ in arms.values():  # trace each model outside the rounds
        model.fit(make_data().take(steps), epochs=1, verbose=0)
    for round_ in range(ROUNDS):
        for name in list(arms)[:: 1 if round_ % 2 == 0 else -1]:
            model, make_data, before, after = arms[name]
            logdir = str(tmp_path / f"{name}-{round_}")
            model.fit(make_data().take(steps), epochs=1, verbose=0,
                      callbacks=[*before, UtilizationMonitor(logdir, audit=False), *after])
            summaries[name].append(summarize(read_run(logdir)))
    return summaries


def _predicted(with_cause: list[dict], without: list[dict], cause: str, above: float = 0.25) -> float:
    """The predicted speed-up of the training time; asserts the achieved one / it within [1 - 0.25, 1 + above]
    (`above` > 0.25 where removing the cause also speeds up the steps' own work on a CPU)."""
    training = statistics.median(s["time_s"]["training"] for s in with_cause)
    predicted_s = statistics.median(s["training_without_s"][cause] for s in with_cause)
    achieved_s = statistics.median(s["time_s"]["training"] for s in without)
    predicted, achieved = training / predicted_s, training / achieved_s
    why = (predicted, achieved, training, predicted_s, achieved_s)
    assert 1 - 0.25 <= achieved / predicted <= 1 + above, why
    return predicted


@pytest.mark.usefixtures("no_nvml")
def test_an_injected_stall_is_predicted_within_a_quarter(tmp_path):
    slow = [SlowEveryFifthStep()]
    summaries = _alternate(tmp_path, {
        "stalled": (tiny_model(device_s=0.01), lambda: stalled_dataset(30, 0.03, prefetch="none"), [], slow),
        "clean": (tiny_model(device_s=0.01), lambda: stalled_dataset(30, 0.0, prefetch="none"), [], slow)}, 30)
    predicted = _predicted(summaries["stalled"], summaries["clean"], "input_wait")
    assert 1.4 < predicted < 2.2  # the 30 ms stall on a ~12 ms step, beside 20 ms of host work a step
    for summary in summaries["stalled"]:  # the finding carries that prediction, ranked first
        top = summary["findings"][0]
        assert top["code"] == "INPUT_BOUND" and top["speedup"] == summary["input_speedup"]
        assert f"after its warm-up: {top['speedup']:.2f}x" in top["message"]


@pytest.mark.usefixtures("no_nvml")
def test_a_callback_before_the_monitor_is_predicted_within_a_quarter(tmp_path):
    x, y = sequences(30)

    def data():
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(2)

    summaries = _alternate(tmp_path, {"logged": (tiny_model(device_s=0.01), data, [Logs15ms()], []),
                                      "plain": (tiny_model(device_s=0.01), data, [], [])}, 30)
    predicted = _predicted(summaries["logged"], summaries["plain"], "callbacks")
    assert predicted > 1.8  # 15 ms beside a ~12 ms step
    for summary in summaries["logged"]:
        [host] = [f for f in summary["findings"] if f["code"] == "HOST_BOUND"]
        assert "The batch hooks of Logs15ms take" in host["message"]
        training, without = summary["time_s"]["training"], summary["training_without_s"]["callbacks"]
        assert host["speedup"] == round(training / without, 2)


@pytest.mark.usefixtures("no_nvml")
def test_the_demo_prediction_holds_for_its_tuned_run(tmp_path):
    from rnnmon import demo

    summaries = _alternate(tmp_path, {"input_bound": (demo.make_model(), lambda: demo.make_dataset(False), [], []),
                                      "tuned": (demo.make_model(), lambda: demo.make_dataset(True), [], [])}, 24)
    # The 30 ms serial decode leaves each step computing after a long wait; the tuned run's parallel decode runs
    # beside the compute instead (see the README): achieved can exceed the prediction on a CPU-only host.
    predicted = _predicted(summaries["input_bound"], summaries["tuned"], "input_wait", above=0.6)
    assert predicted > 2  # the serial decode is most of the step
