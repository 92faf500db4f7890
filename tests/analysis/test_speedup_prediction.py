"""The speed-up INPUT_BOUND predicts holds: real fits with and without the cause, predicted against achieved.

The achieved speed-up is the ratio of the two runs' median steps, as `rnnmon report` and the demo print it.
On a shared 2-core machine a step's compute varies with the load by more than the 25% checked here, so the
two arms alternate in short fits of models traced once, and each run pools its fits: both see the same load.
The stall scenario's model also waits 10 ms per step for a "device" (as the host waits for a GPU's compute),
so that the CPU-bound part, which the load moves most, is not all of the step.
"""

from __future__ import annotations

import time

import keras
import pytest
from conftest import read_run, stalled_dataset, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize

pytestmark = pytest.mark.slow  # rounds of alternating fits: 20 s

ROUNDS = 4


class SlowEveryFifthStep(keras.callbacks.Callback):
    """Host work on a fifth of the steps (logging, a checkpoint): slow steps that have nothing to do with input."""

    def on_train_batch_end(self, batch, logs=None):
        if batch % 5 == 4:
            time.sleep(0.15)


def _alternate(tmp_path, arms: dict, steps: int, callbacks=()) -> dict:
    """{name: summary} after ROUNDS rounds of one short fit per arm; `arms` maps name -> (model, make_data)."""
    for _ in range(ROUNDS):
        for name, (model, make_data) in arms.items():
            model.fit(make_data().take(steps), epochs=1, verbose=0,
                      callbacks=[UtilizationMonitor(str(tmp_path / name), audit=False), *callbacks])
    return {name: summarize(read_run(str(tmp_path / name))) for name in arms}


def _predicted_and_achieved(slow: dict, fast: dict, above: float = 0.25) -> tuple[float, float]:
    """Asserts achieved / predicted within [1 - 0.25, 1 + above]: `above` > 0.25 where the fixed run's compute
    also speeds up (a step that follows a long wait computes slower on a CPU; see the README)."""
    predicted = slow["input_speedup"]
    achieved = slow["step_ms"]["median"] / fast["step_ms"]["median"]
    why = (predicted, achieved, slow["step_ms"], fast["step_ms"])
    assert 1 - 0.25 <= achieved / predicted <= 1 + above, why
    bound = [f for f in slow["findings"] if f["code"] == "INPUT_BOUND"]
    if bound:  # the finding carries that prediction
        assert bound[0]["speedup"] == predicted and f"up to {predicted:.1f}x" in bound[0]["message"]
    return predicted, achieved


@pytest.mark.usefixtures("no_nvml")
def test_an_injected_stall_is_predicted_within_a_quarter(tmp_path):
    stalled, clean = tiny_model(device_s=0.01), tiny_model(device_s=0.01)
    summaries = _alternate(tmp_path, {"stalled": (stalled, lambda: stalled_dataset(20, 0.03, prefetch="none")),
                                      "clean": (clean, lambda: stalled_dataset(20, 0.0, prefetch="none"))}, 20,
                           callbacks=[SlowEveryFifthStep()])
    predicted, achieved = _predicted_and_achieved(summaries["stalled"], summaries["clean"])
    assert predicted > 2 and achieved > 2  # the 30 ms stall dominates a step of about 12 ms
    assert summaries["stalled"]["findings"][0]["code"] == "INPUT_BOUND"  # ranked first


@pytest.mark.usefixtures("no_nvml")
def test_the_demo_prediction_holds_for_its_tuned_run(tmp_path):
    from rnnmon import demo

    slow, tuned = demo.make_model(), demo.make_model()
    summaries = _alternate(tmp_path, {"input_bound": (slow, lambda: demo.make_dataset(False)),
                                      "tuned": (tuned, lambda: demo.make_dataset(True))}, 24)
    # Measured: 5.07 vs 6.98 and 5.96 vs 8.11 achieved on loaded machines (1.36-1.38x the prediction), as close
    # as 2.6 vs 3.1 on a quiet one: the 30 ms serial decode leaves each step computing after a long wait.
    predicted, _ = _predicted_and_achieved(summaries["input_bound"], summaries["tuned"], above=0.6)
    assert predicted > 2  # the serial decode is most of the step
