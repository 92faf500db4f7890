"""The Scalars tab's window means: one point per `SCALAR_WINDOW_S` of steps and one at the fit's end, not one per
2-s flush (whose bytes outweighed the flush's steps: issue 30 item 2)."""

from __future__ import annotations

import glob
import os

import pytest
from tensorboard.compat.proto import event_pb2

from rnnmon.capture.recorder import SCALAR_WINDOW_S, Recorder
from rnnmon.format.eventfile import scan_records
from rnnmon.format.writer import SummaryWriter


def _scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    (path,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    for record in scan_records(path).records:
        event = event_pb2.Event.FromString(record)
        for value in event.summary.value:
            if value.tensor.float_val:
                found.setdefault(value.tag, []).append((event.step, value.tensor.float_val[0]))
    return found


def test_scalar_means_span_a_window_of_steps_not_a_flush(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    recorder = Recorder(writer, None, wall_offset_s=1_790_000_000.0)
    t, step = 0.0, 0
    for _ in range(15):  # 30 s of 20-ms steps (5 ms of input wait, 1 ms of host gap), a flush every 2 s
        for _ in range(100):
            step += 1
            recorder.add_step((step, 0, t + 0.001, t + 0.02, 0.005, 0.001, 1))
            t += 0.02
        recorder.flush(horizon=t)
    recorder.flush(horizon=t, final=True)
    writer.close()
    scalars = _scalars(str(tmp_path))
    means = scalars["rnnmon/step_time_ms"]
    assert 30 / SCALAR_WINDOW_S - 1 <= len(means) <= 30 / SCALAR_WINDOW_S + 1, means  # was 15: one per flush
    assert means[-1][0] == step  # the fit's last steps are not left out
    assert [value for _, value in means] == pytest.approx([19.0] * len(means))
    assert [value for _, value in scalars["rnnmon/input_wait_fraction"]] == pytest.approx([0.25] * len(means))
    assert [value for _, value in scalars["rnnmon/host_gap_fraction"]] == pytest.approx([0.05] * len(means))
