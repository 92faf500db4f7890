"""The tab over a run of a newer rnnmon: a column more and a newer format version read by name, named in notes.

The run is written by the real writer given the declarations with one more NVML series (and version 4), and
served by the plugin inside TensorBoard's own WSGI application over its data provider.
"""

from __future__ import annotations

import numpy as np
from rnnmon_tensorboard.plugin import RnnmonPlugin
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

from rnnmon.format import schema, series
from rnnmon.format.writer import SummaryWriter

ROUTE = "/data/plugin/rnnmon/"
T0 = 1_790_000_000.0


def _client(logdir) -> werkzeug_test.Client:
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"rnnmon": 0})
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    plugin = RnnmonPlugin(base_plugin.TBContext(logdir=str(logdir), data_provider=provider))
    return werkzeug_test.Client(application.TensorBoardWSGI([plugin], data_provider=provider))


def test_a_newer_writers_run_is_drawn_with_a_note_and_no_error(tmp_path):
    fan = series.Series("fan_speed_pct", "%", "u1", "nvmlDeviceGetFanSpeed")
    newer = series.FORMAT.with_series(series.STATS_PREFIX, fan, version=schema.FORMAT_VERSION + 1)
    writer = SummaryWriter(str(tmp_path / "newer" / "rnnmon"), newer)
    writer.json(schema.RUN_TAG, {"version": newer.version, "status": "finished", "start": T0, "end": T0 + 10, "pid": 1})
    steps = np.array([[i + 1, 0, T0 + i * 0.1, T0 + i * 0.1 + 0.08, 1.0, 20.0, 1] for i in range(50)])
    steps[0, 5] = np.nan
    writer.table(schema.STEPS_TAG, steps)
    times = T0 + np.arange(30) * 0.2
    device = {"index": 0, "name": "NVIDIA H200"}
    writer.table(f"{schema.UTIL_TAG_PREFIX}0", np.column_stack([times, np.full(30, 70.0)]), device=device)
    stats = np.zeros((30, len(schema.STAT_COLUMNS) + 1))
    stats[:, 0], stats[:, schema.STAT_COLUMNS.index("sm_activity_pct")], stats[:, -1] = times, 55.0, 40.0
    writer.table(f"{schema.STATS_TAG_PREFIX}0", stats, device=device)
    writer.close()

    client = _client(tmp_path)
    runs = {run["run"]: run for run in client.get(ROUTE + "runs").get_json()["runs"]}
    assert runs["newer/rnnmon"]["errors"] == []
    assert any(f"format version {newer.version}" in note for note in runs["newer/rnnmon"]["notes"])
    summary = client.get(ROUTE + "summary?run=newer/rnnmon").get_json()
    assert summary["errors"] == [] and summary["steps"] == 50
    assert any("fan_speed_pct" in note for note in summary["notes"])
    gpu = client.get(ROUTE + "timeline?run=newer/rnnmon&points=100").get_json()["gpus"][0]
    assert {key for key, _ in series.drawn(series.UTIL) + series.drawn(series.STATS)} <= set(gpu)
    assert set(gpu["util"]["value"]) == {70.0} and set(gpu["sm_activity"]["value"]) == {55.0}
