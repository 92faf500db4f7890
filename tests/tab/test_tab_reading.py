"""How the tab reads runs of a local log directory: its own files, only new records, an index extended in place,
never a value expanded by TensorBoard first; hostile records and two writers, in a real TensorBoard with both
loaders."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from rnnmon_tensorboard.downsample import IntervalCoverage, MinMaxPyramid
from rnnmon_tensorboard.plugin import RnnmonPlugin
from rnnmon_tensorboard.timeline import TimelineIndex
from synthetic_runs import write_gpu_run, write_writers
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins import base_plugin

from rnnmon.format import schema
from rnnmon.format.eventfile import EventFileAppender
from rnnmon.format.reader import RunReader

RUN = "live/rnnmon"


class CountingProvider(data_provider.MultiplexerDataProvider):
    """TensorBoard's own data provider, noting every plugin whose tensor values were asked for."""

    def __init__(self, multiplexer, logdir):
        super().__init__(multiplexer, logdir)
        self.values_read: list[str] = []

    def read_tensors(self, ctx, *, experiment_id, plugin_name, downsample=None, run_tag_filter=None):
        self.values_read.append(plugin_name)
        return super().read_tensors(ctx, experiment_id=experiment_id, plugin_name=plugin_name,
                                    downsample=downsample, run_tag_filter=run_tag_filter)


def test_pyramid_and_coverage_extended_equal_a_fresh_build():
    rng = np.random.default_rng(5)
    x = np.sort(rng.uniform(0, 1000, 50_000))
    values = rng.uniform(0, 100, (len(x), 3)).astype(np.float32)
    values[rng.random(values.shape) < 0.05] = np.nan
    pyramid = MinMaxPyramid(x[:7], values[:7])
    for first, last in [(7, 600), (600, 601), (601, 30_000), (30_000, 50_000)]:
        pyramid = pyramid.appended(x[first:last], values[first:last])
    fresh = MinMaxPyramid(x, values)
    assert len(pyramid.levels) == len(fresh.levels) >= 3
    for (low, high), (fresh_low, fresh_high) in zip(pyramid.levels, fresh.levels):
        np.testing.assert_array_equal(low, fresh_low)
        np.testing.assert_array_equal(high, fresh_high)
    start = rng.uniform(0, 100, 2000)  # intervals in any order, a group that first appears later
    end = start + rng.uniform(0, 2, len(start))
    group = np.where(np.arange(len(start)) < 500, 0, rng.integers(0, 3, len(start)))
    coverage = IntervalCoverage(start[:500], end[:500], group[:500]).appended(start[500:], end[500:], group[500:])
    fresh = IntervalCoverage(start, end, group)
    edges = np.linspace(0, 102, 50)
    np.testing.assert_array_equal(coverage.groups, fresh.groups)
    for index in range(len(fresh.groups)):
        np.testing.assert_array_equal(coverage.covered_before(index, edges), fresh.covered_before(index, edges))


def test_timeline_index_extended_by_new_rows_equals_a_fresh_build(tmp_path):
    run_dir = str(tmp_path / RUN)
    t0 = time.time() - 1000
    write_gpu_run(run_dir, 40, steps_per_chunk=20, gpus=2, status="running", dip_at=100, start=t0)
    reader = RunReader(RUN)
    index = TimelineIndex(reader.update_from_files(run_dir))
    time.sleep(0.2)  # the writer stamps chunks with a millisecond sequence, which runs ahead of the clock here
    write_gpu_run(run_dir, 30, steps_per_chunk=20, gpus=2, dip_at=200, start=t0 + 200)  # a second file, later
    data = reader.update_from_files(run_dir)
    assert reader.reordered == 0  # appended in place: the rows indexed are unchanged
    extended, fresh = index.appended(data), TimelineIndex(data)
    assert extended is not None and extended.appended(data) is extended  # nothing new: the same index
    for start, end, points in [(None, None, 40), (None, None, 4000), (50.0, 260.0, 60), (199.0, 201.0, 1000)]:
        assert extended.view(start, end, points) == fresh.view(start, end, points)
    assert extended.view(None, None, 40)["steps"]["total"] == 70 * 20 - 2  # two warm-up steps
    write_gpu_run(run_dir, 5, start=t0 - 100)  # earlier than the origin: cannot be appended
    assert extended.appended(reader.update_from_files(run_dir)) is None


def test_local_logdir_reads_only_new_records_and_no_values_through_the_provider(tmp_path):
    run_dir = str(tmp_path / RUN)
    t0 = time.time() - 500
    write_gpu_run(run_dir, 30, status="running", start=t0)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"rnnmon": 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = CountingProvider(multiplexer, str(tmp_path))
    plugin = RnnmonPlugin(base_plugin.TBContext(logdir=str(tmp_path), data_provider=provider))
    ctx = context.RequestContext()
    assert plugin.runs_impl(ctx, "")["runs"][0]["status"] == "live"
    before = plugin.timeline_impl(ctx, "", RUN, None, None, 1000)
    assert plugin.summary_impl(ctx, "", RUN)["steps"] == 30 * 5
    assert provider.values_read == []  # run list, timeline, summary: all from the files
    reader = plugin._live[("", RUN)].reader  # kept while the run is running
    decoded = reader.chunks_decoded
    time.sleep(0.2)
    write_gpu_run(run_dir, 10, status="running", start=t0 + 100)  # a second file: 10 x 4 tables, phases, 2 documents
    multiplexer.Reload()
    after = plugin.timeline_impl(ctx, "", RUN, None, None, 1000)
    assert after["steps"]["total"] == before["steps"]["total"] + 49  # its first step is a warm-up
    assert reader.chunks_decoded - decoded == 10 * 4 + 3
    assert plugin.summary_impl(ctx, "", RUN)["steps"] == 40 * 5
    assert provider.values_read == []


def test_runs_reads_the_tabs_first_run_and_the_newest_ahead_within_the_budget(tmp_path):
    t0 = time.time() - 500
    for name in ("a", "b", "c"):  # written in this order: c is the newest, a is listed first
        write_gpu_run(str(tmp_path / name / "rnnmon"), 20, start=t0)
        time.sleep(0.05)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"rnnmon": 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = CountingProvider(multiplexer, str(tmp_path))
    context_ = base_plugin.TBContext(logdir=str(tmp_path), data_provider=provider)
    plugin = RnnmonPlugin(context_, read_ahead_runs=2)
    ctx = context.RequestContext()
    assert [run["run"] for run in plugin.runs_impl(ctx, "")["runs"]] == ["a/rnnmon", "b/rnnmon", "c/rnnmon"]
    deadline = time.monotonic() + 30
    while plugin.read_ahead.done < 2 and time.monotonic() < deadline:  # no route but /runs was asked
        time.sleep(0.02)
    assert plugin.read_ahead.done == 2
    read = {run for _, run in plugin._cache}
    assert read == {"a/rnnmon", "c/rnnmon"}  # the tab's first run and the newest; b waits for its own request
    for run in read:  # index and summary built, the run's tables dropped: what a request leaves behind
        assert set(plugin._cache[("", run)].derived) == {"timeline", "summary"}
        assert len(plugin._cache[("", run)].data.steps) == 0
    plugin.runs_impl(ctx, "")  # a run is read ahead once
    time.sleep(0.2)
    assert plugin.read_ahead.done == 2 and provider.values_read == []
    fresh = RnnmonPlugin(context_, read_ahead_runs=0)
    for run in ("a/rnnmon", "b/rnnmon", "c/rnnmon"):
        assert plugin.timeline_impl(ctx, "", run, None, None, 500) == fresh.timeline_impl(ctx, "", run, None, None, 500)
    small = RnnmonPlugin(context_, read_ahead_bytes=1)  # no index fits: nothing is read ahead
    small.runs_impl(ctx, "")
    time.sleep(0.3)
    assert small.read_ahead.done == 0 and not small._cache


# --- a real TensorBoard, both loaders ------------------------------------------------------------------------------
def _huge_shape_event(tag: str, step: int) -> bytes:
    """A few hundred bytes claiming a 10^9 x 7 float64 table (56 GB once expanded)."""
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, double_val=[1.0], tensor_shape=(
        tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in (10**9, 7)])))
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=schema.tensor_metadata(tag))
    event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value]))
    return event.SerializeToString()


@pytest.fixture(scope="module")
def hostile_logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    write_gpu_run(str(root / "healthy" / "rnnmon"), 10)
    with EventFileAppender(str(root / "huge" / "rnnmon")) as out:
        out.add(_huge_shape_event(schema.RUN_TAG, 1))
        out.add(_huge_shape_event(schema.STEPS_TAG, 2))
    write_writers(str(root / "two_writers" / "rnnmon"), 2, 600, 50)
    return str(root)


def _get(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _cpu_s(pid: int) -> float:
    """CPU seconds used so far by process `pid` and its descendants (TensorBoard's Rust data server): unlike
    wall time, what a request costs them does not grow with the machine's load."""
    stats = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ... utime, stime
            stats[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    tree, found = {pid}, True
    while found:
        children = {p for p, (parent, _) in stats.items() if parent in tree} - tree
        tree, found = tree | children, bool(children)
    return sum(stats[p][1] for p in tree if p in stats) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["--load_fast=true", "--load_fast=false"])  # the Rust data server, Python's
def test_real_tensorboard_refuses_a_huge_shape_and_shows_both_writers(hostile_logdir, loader):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", hostile_logdir, "--port",
                               str(port), "--host", "127.0.0.1", loader],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    route = f"http://127.0.0.1:{port}/data/plugin/rnnmon/"
    try:
        deadline, runs = time.monotonic() + 90, {}
        while time.monotonic() < deadline and len(runs) < 3:
            time.sleep(0.5)
            try:
                status, body = _get(route + "runs")
            except OSError:
                continue  # not up yet
            assert status == 200, body
            runs = {run["run"]: run for run in body["runs"]}
        assert set(runs) == {"healthy/rnnmon", "huge/rnnmon", "two_writers/rnnmon"}
        assert runs["huge/rnnmon"]["errors"] and "1000000000" in runs["huge/rnnmon"]["errors"][0]
        assert not runs["healthy/rnnmon"]["errors"]
        cpu_s = _cpu_s(server.pid)
        status, body = _get(route + "timeline?run=huge/rnnmon")
        assert status == 422 and "unreadable rnnmon data" in body and "rnnmon/steps" in body
        assert _cpu_s(server.pid) - cpu_s < 5  # refused, not expanded (was 23 s and 5 GB per route)
        status, body = _get(route + "timeline?run=healthy/rnnmon")
        assert status == 200 and body["steps"]["total"] == 10 * 5 - 1
        status, body = _get(route + "timeline?run=two_writers/rnnmon&points=5000")
        assert status == 200 and body["steps"]["total"] == 2 * 600 - 2  # every step of both; two warm-ups
        assert _get(route + "summary?run=two_writers/rnnmon")[1]["steps"] == 1200
    finally:
        server.terminate()
        server.wait(timeout=30)
