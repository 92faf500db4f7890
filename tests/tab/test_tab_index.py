"""The tab drawn from runs' reading indexes (rnnmon_tensorboard.indexed_timeline): the cache's budget bounds every
run, one included, counted on what the plugin holds; a real TensorBoard serves /timeline from the index and says
where the index disagreed with the data."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from rnnmon_tensorboard.plugin import RnnmonPlugin
from synthetic_runs import LiveRun, write_gpu_run
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin

from rnnmon.format import index, schema
from rnnmon.format.reader import RunReader

CHUNKS, PER_CHUNK = 100, 40


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexed")
    write_gpu_run(str(root / "indexed" / "rnnmon"), CHUNKS, steps_per_chunk=PER_CHUNK)
    shutil.copytree(root / "indexed", root / "old")  # a run of format 2 before the index: built on first read
    shutil.rmtree(root / "old" / "rnnmon" / index.INDEX_DIR)
    shutil.copytree(root / "old", root / "old2")
    shutil.copytree(root / "indexed", root / "cut")  # its event file lost its end; its index still names it
    (path,) = glob.glob(str(root / "cut" / "rnnmon" / "*tfevents*"))
    (folder,) = glob.glob(str(root / "cut" / "rnnmon" / index.INDEX_DIR / "*"))
    os.truncate(path, int(np.fromfile(os.path.join(folder, "dir.steps"), dtype=index.DIRECTORY)[75]["offset"]))
    return str(root)


def _plugin(logdir: str, **options) -> RnnmonPlugin:
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"rnnmon": 0})
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    return RnnmonPlugin(base_plugin.TBContext(logdir=logdir, data_provider=provider), read_ahead_runs=0, **options)


def test_one_run_over_the_cache_budget_is_answered_and_not_kept(logdir):
    ctx = context.RequestContext()
    roomy = _plugin(logdir, index_from_bytes=0)
    answer = roomy.timeline_impl(ctx, "", "old/rnnmon", None, None, 1000)
    held = roomy.cached_bytes()
    assert held > 0  # the old run's index, built in memory
    tight = _plugin(logdir, index_from_bytes=0, cache_bytes=held // 2)
    assert tight.timeline_impl(ctx, "", "old/rnnmon", None, None, 1000) == answer
    assert tight.cached_bytes() <= held // 2  # was: a single run is kept whole, whatever its size
    whole = _plugin(logdir, index_from_bytes=1 << 40)  # every run read whole (the path of short runs)
    whole.timeline_impl(ctx, "", "indexed/rnnmon", None, None, 1000)
    whole.summary_impl(ctx, "", "indexed/rnnmon")
    held = whole.cached_bytes()
    assert held > 0
    tight = _plugin(logdir, index_from_bytes=1 << 40, cache_bytes=held // 2)
    tight.timeline_impl(ctx, "", "indexed/rnnmon", None, None, 1000)
    tight.summary_impl(ctx, "", "indexed/rnnmon")
    assert tight.cached_bytes() <= held // 2


def test_runs_together_over_the_budget_keep_the_most_recently_asked(logdir):
    ctx = context.RequestContext()
    roomy = _plugin(logdir, index_from_bytes=0)
    roomy.timeline_impl(ctx, "", "old/rnnmon", None, None, 1000)
    one = roomy.cached_bytes()
    plugin = _plugin(logdir, index_from_bytes=0, cache_bytes=one + one // 2)  # room for one of the old runs
    for run in ("old/rnnmon", "old2/rnnmon", "old/rnnmon"):
        plugin.timeline_impl(ctx, "", run, None, None, 1000)
        assert [name for _, name in plugin._indexed] == [run]
        assert plugin.cached_bytes() <= one + one // 2


def test_a_summary_of_a_run_drawn_from_its_index_keeps_no_tables(logdir):
    ctx = context.RequestContext()
    plugin = _plugin(logdir, index_from_bytes=0)
    assert plugin.summary_impl(ctx, "", "indexed/rnnmon")["steps"] == CHUNKS * PER_CHUNK
    assert ("", "indexed/rnnmon") not in plugin._cache  # from its documents and digest: no table read, none kept
    assert plugin._digested[("", "indexed/rnnmon")].summary["steps"] == CHUNKS * PER_CHUNK


def test_a_live_runs_next_summary_reads_its_new_chunk_not_every_digest_record_again(tmp_path):
    """Each new chunk of a live run made /summary read and merge every digest record again (0.19-0.28 s CPU a chunk
    at 10M steps, growing with the run): the plugin keeps a `DigestReader` that merges only what is new."""
    run_dir = str(tmp_path / "live" / "rnnmon")
    live = LiveRun(run_dir)
    live.chunk(5000)
    ctx, plugin = context.RequestContext(), _plugin(str(tmp_path), index_from_bytes=0)  # TensorBoard lists it
    for _ in range(29):
        live.chunk(5000)  # 150k steps: two digest records and a tail
    assert plugin.summary_impl(ctx, "", "live/rnnmon")["steps"] == 150_000
    (digest_path,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*", "digest"))
    for n in range(1, 5):
        live.chunk(100)
        before = _bytes_read()
        assert plugin.summary_impl(ctx, "", "live/rnnmon")["steps"] == 150_000 + 100 * n
        if n > 1:  # (the first also reads the modules a first update imports)
            assert _bytes_read() - before < os.path.getsize(digest_path) // 2  # the new events, not the records
    live.close()


def _get(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.slow
def _bytes_read() -> int:
    """What this process has read so far, page cache included (/proc/self/io's rchar)."""
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])


def test_runs_reads_an_indexed_runs_documents_not_its_rows(logdir, tmp_path):
    # /runs read every byte of a run's event files for its description: 0.1 s of a fresh TensorBoard's first
    # answer at 1M steps, 0.5 s at 10M. The index lists the events holding documents.
    shutil.copytree(os.path.join(logdir, "indexed"), tmp_path / "indexed")
    (event_file,) = glob.glob(str(tmp_path / "indexed" / "rnnmon" / "*tfevents*"))
    plugin = _plugin(str(tmp_path))
    before = _bytes_read()
    (run,) = plugin.runs_impl(context.RequestContext(), "")["runs"]
    read = _bytes_read() - before
    assert read < os.path.getsize(event_file) / 10, (read, os.path.getsize(event_file))
    assert (run["status"], run["errors"]) == ("finished", [])
    whole = RunReader("indexed/rnnmon", tags=frozenset({schema.RUN_TAG})).update_from_files(
        str(tmp_path / "indexed" / "rnnmon"))
    assert run["start"] == whole.info["start"]


def test_runs_reads_a_run_whole_where_its_index_names_bytes_the_file_lacks(logdir):
    # the cut file lost its last description ("finished"): the index's list of documents still names it
    plugin = _plugin(logdir)
    runs = {run["run"]: run for run in plugin.runs_impl(context.RequestContext(), "")["runs"]}
    whole = RunReader("cut/rnnmon", tags=frozenset({schema.RUN_TAG})).update_from_files(
        os.path.join(logdir, "cut", "rnnmon"))
    assert whole.info["status"] == "running"
    assert runs["cut/rnnmon"]["status"] in ("live", "stalled")
    assert (runs["cut/rnnmon"]["start"], runs["cut/rnnmon"]["errors"]) == (whole.info["start"], whole.errors)


@pytest.mark.slow
def test_real_tensorboard_serves_timeline_from_the_index_and_notes_where_the_data_won(logdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port),
                               "--host", "127.0.0.1", "--rnnmon_index_from_bytes=0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    route = f"http://127.0.0.1:{port}/data/plugin/rnnmon/"
    try:
        deadline, runs = time.monotonic() + 90, {}
        while time.monotonic() < deadline and len(runs) < 4:
            time.sleep(0.5)
            try:
                status, body = _get(route + "runs")
            except OSError:
                continue  # not up yet
            runs = {run["run"]: run for run in body["runs"]} if status == 200 else {}
        assert set(runs) == {"indexed/rnnmon", "old/rnnmon", "old2/rnnmon", "cut/rnnmon"}
        answers = {}
        for run in runs:
            status, answers[run] = _get(route + f"timeline?run={run}&points=1280")
            assert status == 200, answers[run]
        assert answers["indexed/rnnmon"]["steps"]["total"] == CHUNKS * PER_CHUNK - 1
        assert answers["indexed/rnnmon"]["notes"] == [] and answers["old/rnnmon"]["notes"] == []
        assert answers["old/rnnmon"]["steps"] == answers["indexed/rnnmon"]["steps"]
        cut = answers["cut/rnnmon"]
        assert "disagrees with the data" in cut["notes"][0]
        assert cut["steps"]["total"] < CHUNKS * PER_CHUNK - 1  # what the event file holds, not what the index said
        status, body = _get(route + "runs")
        assert any("disagrees with the data" in note for note in {r["run"]: r for r in body["runs"]}[
            "cut/rnnmon"]["notes"])
    finally:
        server.terminate()
        server.wait(timeout=30)
