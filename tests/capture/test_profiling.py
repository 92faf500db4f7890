"""The profile captured on an alert: step markers the Profile tab (XProf) groups, or a word where it cannot."""

from __future__ import annotations

import glob
import json
import os

import keras
import pytest
import tensorflow as tf
from conftest import FEATURES, TIMESTEPS, read_run, stalled_dataset

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize
from rnnmon.audit.rnn_layers import while_loop_layers
from rnnmon.capture.profiling import loop_note

CAPTURED = 20
# A default LSTM runs a tf.while_loop in every step without a GPU; with one, its cuDNN kernel has no loop.
GPU = bool(tf.config.list_logical_devices("GPU"))


def _looping_lstm(units: int) -> keras.layers.LSTM:
    """A default LSTM, or on a GPU one kept off cuDNN, as it is with a blocker (see rnnmon.audit.rnn_layers)."""
    return keras.layers.LSTM(units, use_cudnn=False) if GPU else keras.layers.LSTM(units)
INPUT_WAIT = {"input_wait_high": {"pct": 20.0, "resolve_pct": 10.0, "for_s": 0.3}}


def _lstm(timesteps: int = TIMESTEPS, rnn: keras.layers.Layer | None = None, jit_compile: bool | str = "auto"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((timesteps, FEATURES)), rnn or _looping_lstm(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", jit_compile=jit_compile)
    return model


class StopOnceTraced(keras.callbacks.Callback):
    """Ends the fit at the step after the trace was saved (the stall keeps the alert's rule firing until then)."""

    def __init__(self, logdir: str) -> None:
        super().__init__()
        self.pattern = os.path.join(logdir, "rnnmon", "plugins", "profile", "*", "*.xplane.pb")

    def on_train_batch_end(self, batch, logs=None):
        if glob.glob(self.pattern):
            self.model.stop_training = True


def _fit_with_a_capture(model, logdir: str) -> list[str]:
    """A fit whose every batch stalls 20 ms in Python, serially: input_wait_high fires and starts a capture."""
    model.fit(stalled_dataset(400, 0.02, prefetch="none"), epochs=1, verbose=0, callbacks=[
        UtilizationMonitor(logdir, thresholds=INPUT_WAIT, flush_secs=0.2, profile_steps_on_alert=CAPTURED,
                           audit=False), StopOnceTraced(logdir)])
    return glob.glob(os.path.join(logdir, "rnnmon", "plugins", "profile", "*", "*.xplane.pb"))


def _xprof(traces: list[str], tool: str) -> list[dict]:
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data(traces, tool, {})
    assert data, f"xprof could not convert {traces} to {tool}"
    return json.loads(data)


@pytest.mark.slow
@pytest.mark.parametrize("no_loop", ["unroll", "jit_compile"])
def test_a_capture_without_a_loop_is_grouped_into_steps_by_xprof(tmp_path, rnnmon_warnings, no_loop):
    pytest.importorskip("xprof.convert.raw_to_tool_data")
    model = (_lstm(rnn=keras.layers.LSTM(16, unroll=True)) if no_loop == "unroll" else _lstm(jit_compile=True))
    traces = _fit_with_a_capture(model, str(tmp_path))
    assert len(traces) == 1, traces
    run = read_run(str(tmp_path))
    assert run.info["profile"]["step_markers"] is True and run.info["profile"]["note"] == ""
    tables = _xprof(traces, "input_pipeline_analyzer")
    step_table = next(t for t in tables if [c.get("id") for c in t.get("cols", [])][:1] == ["stepnum"])
    # Markers around the step alone, the fetch outside, made XProf see 0% input on the same stall.
    assert len(step_table["rows"]) > CAPTURED // 2, len(step_table["rows"])  # 18 of 20 measured
    conclusion = step_table["p"]["input_conclusion"]
    summary = summarize(run)
    assert summary["verdict"] == "input-bound" and summary["input_wait_fraction"] > 0.5, summary["verdict"]
    assert "HIGHLY input-bound" in conclusion, conclusion
    assert not any("Profile tab cannot group" in message for message in rnnmon_warnings())
    assert not any("Profile tab cannot group" in alert["message"] for alert in run.alerts)


@pytest.mark.slow
def test_a_capture_of_a_looping_lstm_says_the_profile_tab_cannot_group_its_steps(tmp_path, rnnmon_warnings):
    traces = _fit_with_a_capture(_lstm(), str(tmp_path))
    assert len(traces) == 1, traces
    run = read_run(str(tmp_path))
    profile = run.info["profile"]
    assert profile["status"] == "captured" and profile["step_markers"] is False
    assert profile["rule"] == "input_wait_high" and profile["steps"] == CAPTURED
    note = profile["note"]
    assert "Profile tab cannot group" in note and "tf.while_loop" in note and "rnnmon's own per-step" in note
    assert "unroll=True" in note  # 16 timesteps: unrolling suits it
    firing = next(a for a in run.alerts if a["rule"] == "input_wait_high" and a["state"] == "firing")
    assert firing["message"].endswith(f"Profile: {note}"), firing["message"]
    logged = rnnmon_warnings()
    assert any(m.startswith("rnnmon: capturing a profiler trace") and note in m for m in logged), logged
    assert any(m.startswith("rnnmon alert input_wait_high") and note in m for m in logged), logged
    assert summarize(run)["profile"] == profile


def test_the_loop_note_names_unrolling_only_for_short_sequences():
    short, long = loop_note(_lstm(32)), loop_note(_lstm(200))
    assert "RNN layer(s) 'lstm" in short and "unroll=True" in short and "jit_compile=True" in short
    assert "tf.while_loop" in long and "unroll" not in long and "jit_compile" not in long


def test_no_loop_note_without_a_while_loop():
    assert loop_note(_lstm(rnn=keras.layers.GRU(8, unroll=True))) == ""
    assert loop_note(_lstm(jit_compile=True)) == ""
    assert "tf.while_loop" in loop_note(_lstm(rnn=keras.layers.Bidirectional(_looping_lstm(8))))


def test_with_a_gpu_only_rnn_layers_without_the_cudnn_kernel_loop():
    inputs = keras.Input((TIMESTEPS, FEATURES))
    sequence = keras.layers.LSTM(8, return_sequences=True, name="fast")(inputs)
    generic = keras.layers.GRU(8, recurrent_dropout=0.1, name="slow")  # no cuDNN kernel with recurrent dropout
    model = keras.Model(inputs, keras.layers.Bidirectional(generic, name="bi")(sequence))
    looped = while_loop_layers(model, gpu=False)
    assert looped[0] == "fast" and len(looped) == 3 and all(path.startswith("bi/") for path in looped[1:]), looped
    assert while_loop_layers(model, gpu=True) == looped[1:]
