"""A self-describing format: one declaration per series, tables read by their stored column names, and files of
older and newer writers (a column fewer, a column more, another order, a newer version) read by today's reader."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from rnnmon.format import packing, schema, series
from rnnmon.format.eventfile import EventFileAppender
from rnnmon.format.logdir import read_logdir
from rnnmon.format.reader import RunReader, open_logdir, read_runs
from rnnmon.format.writer import SummaryWriter

T0 = 1_790_000_000.0
STATS0 = f"{schema.STATS_TAG_PREFIX}0"
FAN = series.Series("fan_speed_pct", "%", "u1", "nvmlDeviceGetFanSpeed")
PRE_GPM = schema.STAT_COLUMNS[:9]  # the statistics before the GPM columns were added


def _stats(n: int, columns: tuple[str, ...] = schema.STAT_COLUMNS) -> np.ndarray:
    """Stat rows in `columns`: values every storage code holds exactly (f2 to a unit, u1 below 256)."""
    rng = np.random.default_rng(len(columns))
    rows = np.empty((n, len(columns)))
    for i, name in enumerate(columns):
        rows[:, i] = T0 + np.arange(n) * 0.25 if name == "time" else rng.integers(0, 100, n)
    return rows


def _both_ways(logdir) -> list:
    """The run under `logdir` read from its files, and through TensorBoard's data provider."""
    provider, ctx = open_logdir(str(logdir))
    return [read_logdir(str(logdir))["run/rnnmon"], read_runs(provider, ctx)["run/rnnmon"]]


def _write(logdir, fmt: series.Format, rows: np.ndarray, devices: int = 1) -> None:
    writer = SummaryWriter(str(logdir / "run" / "rnnmon"), fmt)
    writer.json(schema.RUN_TAG, {"version": fmt.version, "status": "finished", "start": T0, "pid": 1})
    for chunk in (rows[:10], rows[10:]):
        for device in range(devices):
            writer.table(f"{schema.STATS_TAG_PREFIX}{device}", chunk, device={"index": device, "name": "H200"})
        writer.flush()
    writer.close()


def _event(tag: str, tensor: tensor_pb2.TensorProto, step: int, content: dict) -> bytes:
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    value.metadata.plugin_data.plugin_name = schema.PLUGIN_NAME
    value.metadata.plugin_data.content = json.dumps(content).encode()
    value.metadata.data_class = summary_pb2.DATA_CLASS_TENSOR
    return event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])
                           ).SerializeToString()


def test_every_table_derives_from_its_declaration():
    for table in series.FORMAT.tables:
        tag = f"{table.tag}0" if table.per_device else table.tag
        content = schema.parse_content(schema.tensor_metadata(tag).plugin_data.content)
        assert schema.columns_for(tag) == table.columns and content["columns"] == list(table.columns)
        assert content["version"] == schema.FORMAT_VERSION == 5
        if table.codec == series.ROWS_CODEC:  # what a reader needs to decode a layout it did not compile in
            assert content["storage"] == list(table.storage) and content["layout"] == table.layout
            assert packing.layout_of(tag) == packing.Layout(table.layout, table.columns, table.storage)
        else:
            assert "storage" not in content


def test_a_column_added_by_a_newer_writer_reads_as_the_older_file_does(tmp_path):
    """A new NVML column is one `Series` more: the real writer, given the declaration with it, writes a file
    today's reader reads by name, beside a file of today's writer; the unknown column is skipped and named."""
    newer = series.FORMAT.with_series(series.STATS_PREFIX, FAN)
    rows = _stats(40, newer.tables[3].columns)
    _write(tmp_path / "newer", newer, rows)
    _write(tmp_path / "today", series.FORMAT, rows[:, :-1])
    for logdir in (tmp_path / "newer", tmp_path / "today"):
        for run in _both_ways(logdir):
            assert run.errors == []
            np.testing.assert_array_equal(run.stats[0][:, 1:], rows[:, 1:-1])
            np.testing.assert_allclose(run.stats[0][:, 0], rows[:, 0], atol=1e-6, rtol=0)
            fan_notes = [note for note in run.notes if "fan_speed_pct" in note]
            assert len(fan_notes) == (logdir.name == "newer")
            assert not fan_notes or "rnnmon/stats/gpu<N>" in fan_notes[0]


def test_columns_in_another_order_are_mapped_by_name_not_position(tmp_path):
    """Same row size, another order: decoding by compiled-in position would put power in the memory column."""
    moved = (series.STATS.series[0], series.STATS.series[3], *series.STATS.series[1:3], *series.STATS.series[4:])
    other = series.Format(3, tuple(series.Table(t.tag, t.layout, t.codec, moved, True) if t is series.STATS else t
                                   for t in series.FORMAT.tables))
    columns = tuple(s.name for s in moved)
    rows = _stats(30, columns)
    _write(tmp_path, other, rows)
    for run in _both_ways(tmp_path):
        assert run.errors == []
        for name in ("memory_used_mib", "power_w", "dram_bw_util_pct"):
            read = run.stats[0][:, schema.STAT_COLUMNS.index(name)]
            np.testing.assert_array_equal(read, rows[:, columns.index(name)])


def test_an_older_version_2_file_without_a_column_reads_it_as_missing(tmp_path):
    """A version-2 writer from before the GPM columns: metadata names 9 columns and no storage codes (a reader
    takes the declared codes of those names); packed and float64 chunks both read, the GPM columns NaN."""
    rows = _stats(20, PRE_GPM)
    old = packing.Layout(4, PRE_GPM, tuple(dict(zip(schema.STAT_COLUMNS, series.STATS.storage))[n] for n in PRE_GPM))
    content = {"version": 2, "columns": list(PRE_GPM), "device": {"index": 0, "name": "A100"}}
    double = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, tensor_content=rows[10:].astype("<f8").tobytes(),
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto(
                                        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in (10, 9)]))
    with EventFileAppender(str(tmp_path / "run" / "rnnmon")) as out:
        out.add(_event(schema.RUN_TAG, tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[
            b'{"version": 2, "status": "finished", "start": 1.0}']), 1, {"version": 2}))
        packed = packing.encode(STATS0, rows[:10], old)
        assert len(packed) != len(packing.encode(STATS0, _stats(10), None))  # not today's layout 4
        out.add(_event(STATS0, tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[packed]), 2, content))
        out.add(_event(STATS0, double, 3, content))
    for run in _both_ways(tmp_path):
        assert run.errors == [] and run.notes == [] and run.devices[0]["name"] == "A100"
        stats = run.stats[0]
        np.testing.assert_array_equal(stats[:, 1:9], rows[:, 1:])
        assert np.isnan(stats[:, 9:]).all()


def test_a_newer_format_version_is_one_note_and_reads_by_name(tmp_path):
    newer = series.FORMAT.with_series(series.STATS_PREFIX, FAN, version=schema.FORMAT_VERSION + 1)
    rows = _stats(40, newer.tables[3].columns)
    _write(tmp_path, newer, rows, devices=2)
    _write(tmp_path, newer, rows)  # a second file in the run's folder: still one note
    for run in _both_ways(tmp_path):
        assert run.errors == [] and sorted(run.stats) == [0, 1]
        np.testing.assert_array_equal(run.stats[1][:, 1:], rows[:, 1:-1])
        versions = [note for note in run.notes if f"format version {schema.FORMAT_VERSION + 1}" in note]
        assert len(versions) == 1, run.notes


def test_metadata_describing_a_layout_this_reader_cannot_decode_is_an_error_not_a_guess(tmp_path):
    """Storage codes it does not know: the tag's packed chunks are errors (no fallback to the compiled layout,
    whose row size this one matches), and the rest of the run reads."""
    content = {"version": 4, "columns": list(schema.STAT_COLUMNS), "layout": 4,
               "storage": ["t", *["q4"] * 8, *["f2"] * 4]}
    blob = packing.encode(STATS0, _stats(10), None)
    with EventFileAppender(str(tmp_path / "run" / "rnnmon")) as out:
        out.add(_event(STATS0, tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[blob]), 2, content))
        out.add(_event(f"{schema.UTIL_TAG_PREFIX}0", tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING, string_val=[packing.encode(f"{schema.UTIL_TAG_PREFIX}0", [[T0, 40.0]])]), 3,
            {"version": 4, "columns": ["time", "util_pct"]}))
    run = RunReader("run/rnnmon").update_from_files(str(tmp_path / "run" / "rnnmon"))
    assert len(run.errors) == 1 and STATS0 in run.errors[0] and "q4" in run.errors[0], run.errors
    assert 0 not in run.stats and run.util[0].tolist() == [[T0, 40.0]]


@pytest.mark.parametrize("storage", [["t", "t"], ["u1", "f4"], ["t"]])
def test_a_stored_layout_that_cannot_be_decoded_is_refused(storage):
    with pytest.raises(packing.FormatError):
        packing.stored_layout(f"{schema.UTIL_TAG_PREFIX}0", {"columns": ["time", "util_pct"], "storage": storage})


def test_the_format_page_lists_every_declared_column():
    import pathlib
    import re

    page = (pathlib.Path(__file__).parents[2] / "docs" / "format.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"^\| `(rnnmon/[\w/<>]+)` \| `([\w, ]+)` \|", page, re.MULTILINE))
    for table in series.FORMAT.tables:
        assert listed[f"{table.tag}<N>" if table.per_device else table.tag] == ", ".join(table.columns)
