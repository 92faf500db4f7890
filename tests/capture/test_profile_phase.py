"""A profiler's start and its stop-and-save are a `profile` phase: never host time between steps, nor input wait.

Keras's `TensorBoard(profile_batch=(5, 8))` starts a trace in its `on_train_batch_begin` and stops and saves it in its
`on_train_batch_end`; rnnmon's own capture after an alert does the same between steps. Each costs 0.1-0.2 s on a
CPU: on a short run of short steps that alone made the run host-bound. (rnnmon's own capture: tests/alerts/
test_delivery.py::test_profile_is_captured_after_an_alert.)
"""

from __future__ import annotations

import glob

import numpy as np
import pytest
from conftest import BATCH, read_run, sequences, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.fit_time import PARTS
from rnnmon.analysis.summary import summarize
from rnnmon.format import schema
from rnnmon.report import build_report, render_text

PROFILE = schema.PHASE_KINDS.index("profile") if "profile" in schema.PHASE_KINDS else -1


def _profile_phases(run) -> np.ndarray:
    return run.phases[run.phases[:, 0] == PROFILE]


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize("monitor_first", [True, False])
def test_keras_tensorboard_profile_batch_is_a_profile_phase_not_host_time(tmp_path, monitor_first):
    import keras
    import tensorboard.summary  # noqa: F401
    import tensorflow as tf

    # Keras's TensorBoard imports tensorboard.summary at its first batch-end scalar; where boto3 is installed
    # (tests/storage needs it) tensorboard's file-system stub imports it too: one real host gap of 0.09-0.44 s
    # after step 1, a host share of 0.17-0.26 in this 0.7 s fit. Imported here, the share is the profiler's.
    x, y = sequences(40)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(2)
    board = keras.callbacks.TensorBoard(str(tmp_path / "tb"), profile_batch=(5, 8))
    monitor = UtilizationMonitor(str(tmp_path), audit=False)
    tiny_model(device_s=0.01).fit(dataset, epochs=1, verbose=0,
                                   callbacks=[monitor, board] if monitor_first else [board, monitor])
    assert glob.glob(str(tmp_path / "tb" / "train" / "plugins" / "profile" / "*" / "*.xplane.pb"))  # it did profile

    run = read_run(str(tmp_path))
    phases = _profile_phases(run)
    assert len(phases) == 2, run.phases  # the start (before batch 5) and the stop-and-save (after batch 8)
    steps = run.steps[:, schema.STEP_COLUMNS.index("step")]
    begin = run.steps[:, schema.STEP_COLUMNS.index("begin")]
    gap_ms = run.steps[:, schema.STEP_COLUMNS.index("host_gap_ms")]
    for (_, start, end), after in zip(phases, (5, 9), strict=True):  # Keras counts batches from 1: 5 is step 5
        [row] = np.flatnonzero(steps == after)
        assert end == pytest.approx(begin[row], abs=1e-5) and gap_ms[row] == pytest.approx(0.0, abs=1e-3)
        assert start == pytest.approx(run.steps[row - 1, schema.STEP_COLUMNS.index("end")], abs=1e-5)
    summary = summarize(run)
    times = summary["time_s"]
    assert times["profiling"] == pytest.approx(float((phases[:, 2] - phases[:, 1]).sum()), abs=1e-3)
    # Before, the profiler's 25-55 ms here were host gaps: a host share of 0.15-0.18, host-bound at 5 ms steps
    assert summary["shares"]["host"] < 0.15 and summary["verdict"] == "compute-bound", (summary["shares"], times)
    assert abs(sum(times[part] for part in PARTS) - times["fit"]) <= 0.02 * times["fit"], times
    assert "profiling" in render_text(build_report(str(tmp_path)))


@pytest.mark.slow
@pytest.mark.usefixtures("no_nvml")
def test_a_profile_window_on_epoch_boundaries_shares_them_with_the_epoch_ends(tmp_path):
    """Started at an epoch's first batch (inside the open epoch boundary) and stopped at its last (before the next
    boundary): each profile phase adjoins an epoch-end phase, and no moment is in two records."""
    import keras
    import tensorflow as tf

    x, y = sequences(10)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(2)
    board = keras.callbacks.TensorBoard(str(tmp_path / "tb"), profile_batch=(11, 20))  # the second epoch, whole
    tiny_model().fit(dataset, epochs=3, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path), audit=False), board])
    run = read_run(str(tmp_path))
    phases = run.phases[np.argsort(run.phases[:, 1])]
    kinds = [schema.PHASE_KINDS[int(k)] for k in phases[:, 0]]
    assert kinds == ["warmup", "epoch_end", "profile", "profile", "epoch_end", "epoch_end"], kinds
    assert phases[1, 2] == phases[2, 1] and phases[3, 2] == phases[4, 1]  # they adjoin
    begin = run.steps[:, schema.STEP_COLUMNS.index("begin")]
    end = run.steps[:, schema.STEP_COLUMNS.index("end")]
    assert phases[2, 2] == pytest.approx(begin[10], abs=1e-5)  # the start: until step 11 begins
    assert phases[3, 1] == pytest.approx(end[19], abs=1e-5)  # the stop and save: from step 20's end
    times = summarize(run)["time_s"]
    assert abs(times["unaccounted"]) <= 0.02 * times["fit"], times
