"""The on-disk format: what the writer writes, TensorBoard's data provider reads back."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import read_run

from rnnmon.format import schema
from rnnmon.format.writer import SummaryWriter


def test_tables_json_and_scalars_round_trip_through_the_data_provider(tmp_path):
    writer = SummaryWriter(str(tmp_path / "rnnmon"))
    steps = np.array([[1, 0, 10.0, 10.5, 1.0, np.nan, 1], [2, 0, 10.5, 11.0, 2.0, 0.1, 1]])
    writer.json(schema.RUN_TAG, {"status": "running", "backend": "jax", "start": 1.0, "pid": 1})
    writer.table(schema.STEPS_TAG, steps)
    writer.table(schema.STEPS_TAG, steps + np.array([2, 0, 1, 1, 0, 0, 0]))
    writer.table(f"{schema.UTIL_TAG_PREFIX}3", [[10.0, 55.0]], device={"index": 3, "name": "NVIDIA A100"})
    writer.scalar("rnnmon/step_time_ms", 1.5, step=2)
    writer.close()
    run = read_run(str(tmp_path))
    assert run.info["backend"] == "jax" and run.fits == 1
    np.testing.assert_array_equal(run.steps[:2], steps)
    assert run.steps[:, 0].tolist() == [1, 2, 3, 4]
    assert run.devices[3]["name"] == "NVIDIA A100" and run.util[3].tolist() == [[10.0, 55.0]]


def test_every_rnnmon_tag_sets_the_data_class():
    from tensorboard.compat.proto import summary_pb2

    for tag in (schema.RUN_TAG, schema.STEPS_TAG, schema.GAPS_TAG, f"{schema.STATS_TAG_PREFIX}0"):
        meta = schema.tensor_metadata(tag)
        assert meta.data_class == summary_pb2.DATA_CLASS_TENSOR and meta.plugin_data.plugin_name == "rnnmon"


def test_malformed_chunk_is_reported_for_that_tag(tmp_path):
    writer = SummaryWriter(str(tmp_path / "rnnmon"))
    writer.json(schema.RUN_TAG, {"status": "finished"})
    writer.table(schema.STEPS_TAG, [[1.0, 2.0]])  # two columns where seven belong
    writer.close()
    run = read_run(str(tmp_path))
    assert run.errors and "rnnmon/steps" in run.errors[0] and len(run.steps) == 0


@pytest.mark.parametrize(("argument", "value"), [("flush_secs", 10), ("idle_pct", -1), ("sample_interval_s", 0),
                                                 ("devices", "first"), ("min_gap_ms", -5)])
def test_invalid_arguments_are_rejected_with_the_value(argument, value):
    from rnnmon import UtilizationMonitor

    with pytest.raises(ValueError, match=f"Received: {argument}="):
        UtilizationMonitor("logs", **{argument: value})
