"""The rnnmon tab's backend: routes over real fits, downsampling, sample limits, bad input, unreadable runs, and
the thresholds file the tab reads and saves (its only write)."""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request

import numpy as np
import pytest
from rnnmon_tensorboard import plotly_bundle
from rnnmon_tensorboard import plugin as plugin_module
from rnnmon_tensorboard.downsample import MinMaxPyramid, bin_intervals, minmax_indices
from rnnmon_tensorboard.labels import CAUSE_LABELS, LABELS, PHASE_LABELS
from rnnmon_tensorboard.loader import RnnmonLoader
from rnnmon_tensorboard.plugin import RnnmonPlugin
from rnnmon_tensorboard.thresholds_store import reaches
from served_plugin import ROUTE, get, plugin_client, served_plugin
from synthetic_runs import truncate_event_file, write_bad_description_run, write_gpu_run, write_unreadable_run
from tensorboard import context
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

from rnnmon.alerts.thresholds import Thresholds
from rnnmon.alerts.thresholds_file import (
    LEVELS_UP,
    THRESHOLDS_FILE,
    load_thresholds_file,
    save_thresholds_file,
    thresholds_files,
)
from rnnmon.analysis import verdict
from rnnmon.analysis.stragglers import worker_of
from rnnmon.analysis.summary import summarize
from rnnmon.capture.workers import worker_name
from rnnmon.format import schema
from rnnmon.format.reader import open_logdir, read_runs
from rnnmon.format.writer import SummaryWriter
from rnnmon.report import build_report, render_text

CHUNKS = 150  # more than either loader keeps by default for an unknown plugin (10 and 100)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, recorded_runs):
    """Three real fits (CPU-only, on a fake GPU that idles a third of every second, on one without GPM: see
    `recorded_runs`) plus written runs."""
    root = tmp_path_factory.mktemp("logs")
    for run in ("cpu_fit", "gpu_fit", "no_gpm_fit"):
        shutil.copytree(recorded_runs / run, root / run)
    write_gpu_run(str(root / "long" / "rnnmon"), CHUNKS, dip_at=777)
    write_unreadable_run(str(root / "unreadable" / "rnnmon"))
    write_bad_description_run(str(root / "bad_description" / "rnnmon"))
    write_gpu_run(str(root / "truncated" / "rnnmon"), 20)
    truncate_event_file(str(root / "truncated" / "rnnmon"), age_s=60)  # no writer is still finishing the record
    return str(root)


@pytest.fixture(scope="module")
def client(logdir):
    return plugin_client(logdir)


# --- downsampling -----------------------------------------------------------------------------------------
def test_minmax_keeps_a_single_sample_dip_and_spike():
    x = np.arange(100_000) / 6.0
    y = np.full(len(x), 80.0)
    y[31_337], y[77_777] = 0.0, 100.0
    keep = minmax_indices(x, y, points=200, lo=x[0], hi=x[-1])
    assert len(keep) <= 200
    assert 31_337 in keep and 77_777 in keep
    assert np.all(np.diff(keep) > 0)  # time order


def test_minmax_keeps_each_columns_extremes_and_skips_nan():
    x = np.arange(1000.0)
    values = np.column_stack([np.sin(x), np.cos(x), np.full(1000, np.nan)])
    values[500, 1] = -9.0
    keep = minmax_indices(x, values, points=60, lo=0.0, hi=999.0)
    assert len(keep) <= 60 and 500 in keep
    assert np.argmax(values[:, 0]) in keep


def test_minmax_keeps_everything_that_fits():
    x = np.arange(50.0)
    assert minmax_indices(x, x.copy(), points=100, lo=0, hi=49).tolist() == list(range(50))


def _bucket_extremes(x, values, rows, lo, hi, buckets):
    """{(column, bucket): (min, max)} over `rows`, the slow obvious way."""
    width = (hi - lo) / buckets
    out = {}
    for column in range(values.shape[1]):
        ok = rows[~np.isnan(values[rows, column])]
        bucket = np.clip(((x[ok] - lo) / width).astype(int), 0, buckets - 1)
        for b in np.unique(bucket):
            picked = values[ok[bucket == b], column]
            out[column, int(b)] = (float(picked.min()), float(picked.max()))
    return out


def test_pyramid_keeps_every_buckets_extremes_and_every_dip_at_every_zoom():
    rng = np.random.default_rng(3)
    x = np.sort(rng.uniform(0, 5000, 300_000))
    values = rng.uniform(60, 95, (len(x), 2)).astype(np.float32)
    values[rng.random(values.shape) < 0.05] = np.nan
    dips = np.r_[rng.choice(len(x), 40, replace=False), np.searchsorted(x, [77.2, 130.0, 1300.0, 2600.0])]
    values[dips, 0] = 0.0  # single-sample idle dips
    pyramid = MinMaxPyramid(x, values)
    assert len(pyramid.levels) >= 3
    for lo, hi in [(0, 5000), (0.0, 2500.0), (1234.5, 4321.0), (100.0, 160.0), (77.0, 77.5)]:
        first, last = np.searchsorted(x, lo), np.searchsorted(x, hi, side="right")
        keep = pyramid.indices(first, last, 1000, lo, hi)
        assert len(keep) <= 1000 and np.all(np.diff(keep) > 0) and first <= keep.min() and keep.max() < last
        shown = dips[(dips >= first) & (dips < last)]
        width = (hi - lo) / 250 if last - first > 1000 else np.inf
        dipped = {min(249, int((x[row] - lo) // width)) for row in keep if values[row, 0] == 0.0}
        assert shown.size and {min(249, int((x[row] - lo) // width)) for row in shown} == dipped  # their buckets
        if last - first > 1000:
            rows = np.arange(first, last)
            assert _bucket_extremes(x, values, keep, lo, hi, 250) == _bucket_extremes(x, values, rows, lo, hi, 250)


def test_bin_intervals_gives_the_covered_share_per_bucket_and_group():
    start = np.array([0.1, 0.3, 2.5, 0.0])
    end = np.array([0.2, 0.4, 4.5, 1.0])
    group = np.array([0, 0, 0, 1])
    s, e, g, share = bin_intervals(start, end, group, lo=0.0, hi=5.0, buckets=5)
    rows = [(float(a), float(b), int(c), round(float(d), 6)) for a, b, c, d in zip(s, e, g, share)]
    assert rows == [(0.0, 1.0, 0, 0.2), (0.0, 1.0, 1, 1.0), (2.0, 3.0, 0, 0.5), (3.0, 4.0, 0, 1.0),
                    (4.0, 5.0, 0, 0.5)]


# --- routes over real fits ---------------------------------------------------------------------------------
def test_runs_lists_every_run_with_status(client):
    status, body = get(client, "runs")
    assert status == 200
    runs = {run["name"]: run for run in body["runs"]}
    assert set(runs) == {"cpu_fit", "gpu_fit", "no_gpm_fit", "long", "unreadable", "bad_description", "truncated"}
    assert runs["cpu_fit"]["run"] == "cpu_fit/rnnmon"
    assert runs["cpu_fit"]["status"] == "finished" and not runs["cpu_fit"]["live"]
    assert runs["bad_description"]["errors"] and not runs["cpu_fit"]["errors"]


def test_runs_name_each_workers_job_as_python_does(client):
    """The tab asks /workers for a run with a job, and compares a job's runs: /runs names the job as worker_of does
    (the tab split the path itself, and took `worker-0/rnnmon`'s job for "" where Python says ".")."""
    assert {run["job"] for run in get(client, "runs")[1]["runs"]} == {None}  # no worker's run in this log dir
    tasks = [json.dumps({"cluster": {}, "task": {"type": kind, "index": index}})
             for kind, index in (("worker", 1), ("chief", 0), ("evaluator", 0), ("worker", 12), ("ps", 0),
                                 ("master", 3))]
    written = [f"job/{worker_name({'TF_CONFIG': task})}/rnnmon" for task in tasks]  # where monitors write
    others = ["exp1/rnnmon", "worker-1x/rnnmon", "myworker-1/rnnmon", "job/worker-1/rnnmon/rnnmon", "rnnmon"]
    for run in [*written, "process-3/rnnmon", *others]:
        assert (worker_of(run) is not None) == (run not in others), run


def test_runs_and_workers_carry_what_the_tab_would_otherwise_copy(tmp_path):
    """Each run's job and whether the saved thresholds reach it, the words for every gap cause and phase kind,
    and each worker's place by name (worker-2 before worker-10) come from the routes; the tab held its own copies
    of all four."""
    for index in (0, 2, 10):
        write_gpu_run(str(tmp_path / "job" / f"worker-{index}" / "rnnmon"), 10)
    write_gpu_run(str(tmp_path / "worker-0" / "rnnmon"), 10)
    client = plugin_client(str(tmp_path))
    status, listing = get(client, "runs")
    assert status == 200
    assert {run["run"]: run["thresholds_reach"] for run in listing["runs"]} == dict.fromkeys(
        ["job/worker-0/rnnmon", "job/worker-10/rnnmon", "job/worker-2/rnnmon", "worker-0/rnnmon"], True)
    assert [reaches(run) for run in ("rnnmon", "a/b/c/rnnmon", "a/b/c/d/rnnmon")] == [True, True, False]
    assert {run["run"]: run["job"] for run in listing["runs"]} == {
        "job/worker-0/rnnmon": "job", "job/worker-10/rnnmon": "job", "job/worker-2/rnnmon": "job",
        "worker-0/rnnmon": "."}
    assert listing["labels"] == LABELS
    status, workers = get(client, "workers", run="job/worker-0/rnnmon")
    assert status == 200
    assert sorted(workers["workers"], key=lambda row: row["order"])[-1]["worker"] == "worker-10"
    assert sorted(row["order"] for row in workers["workers"]) == [0, 1, 2]


def test_workers_lists_the_workers_it_leaves_out_with_the_reason(tmp_path):
    # /workers left damaged workers out without a word (3 of 64 in a probe): each is listed with its error. A file
    # cut inside a record is no such damage: its readable steps are compared.
    job = tmp_path / "job"
    for index in (0, 2, 5):
        write_gpu_run(str(job / f"worker-{index}" / "rnnmon"), 10)
    write_unreadable_run(str(job / "worker-1" / "rnnmon"))
    write_bad_description_run(str(job / "worker-3" / "rnnmon"))
    write_gpu_run(str(job / "worker-10" / "rnnmon"), 10)
    truncate_event_file(str(job / "worker-10" / "rnnmon"), age_s=60)  # no writer is still finishing the record
    write_gpu_run(str(job / "worker-4" / "rnnmon"), 1)  # 5 steps: too few to compare
    status, body = get(plugin_client(str(tmp_path)), "workers", run="job/worker-0/rnnmon")
    assert status == 200 and {row["worker"] for row in body["workers"]} == {"worker-0", "worker-2", "worker-5",
                                                                            "worker-10"}
    left_out = {row["worker"]: row for row in body["left_out"]}
    assert list(left_out) == ["worker-1", "worker-3", "worker-4"]  # in index order
    for worker, reason in (("worker-1", "expected rows of 7 columns"),
                           ("worker-3", "a table where a JSON document belongs")):
        assert "unreadable rnnmon data" in left_out[worker]["reason"] and reason in left_out[worker]["reason"]
        assert left_out[worker]["run"] == f"job/{worker}/rnnmon"
    assert left_out["worker-4"]["reason"] == "too few steps to compare"
    assert get(plugin_client(str(tmp_path)), "workers", run="job/worker-1/rnnmon")[1]["left_out"]  # from any worker


@pytest.mark.slow
def test_workers_of_a_256_worker_job_are_summarized_once_per_version_straggler_first(tmp_path):
    # /workers re-summarized every worker at every request (3.2 s at 256 workers; the tab's chart waited for it).
    start = time.time() - 600
    for index in range(256):  # worker-37 waits 10 ms more per step for its input
        write_gpu_run(str(tmp_path / "job" / f"worker-{index}" / "rnnmon"), 4, start=start,
                      wait_s=0.016 if index == 37 else 0.006)
    plugin, client = served_plugin(str(tmp_path))
    status, body = get(client, "workers", run="job/worker-0/rnnmon")
    assert status == 200 and len(body["workers"]) == 256 and not body["left_out"]
    assert plugin.workers_summarized == 256
    assert body["straggler"] == body["workers"][0]["worker"] == body["findings"][0]["where"] == "worker-37"
    waits = [row["input_wait_ms"] + row["host_gap_ms"] for row in body["workers"][1:]]
    assert waits == sorted(waits, reverse=True)  # then the longest stall per step
    view = body["heatmap"]  # worker x time: a row per worker in index order
    assert view["workers"] == [f"worker-{index}" for index in range(256)] and view["columns"] == 60
    assert len(view["step_ms"]) == len(view["wait_share"]) == 256
    assert all(len(row) == 60 for row in view["step_ms"] + view["wait_share"])
    share = [statistics.fmean(v for v in row if v is not None) for row in view["wait_share"]]
    assert share[37] > 2 * max(share[:37] + share[38:])
    assert 17.5 < statistics.median(v for v in view["step_ms"][0] if v is not None) < 18.5  # 0.9 x a 20 ms step
    began = time.monotonic()
    again = get(client, "workers", run="job/worker-200/rnnmon")  # any worker's run: the same job
    assert again == (status, body) and plugin.workers_summarized == 256  # nothing changed: nothing read again
    assert time.monotonic() - began < 1.0  # 0.03 s here; 3.2 s when every worker was summarized again
    write_gpu_run(str(tmp_path / "job" / "worker-5" / "rnnmon"), 2, start=start + 100)  # worker-5 grows
    status, changed = get(client, "workers", run="job/worker-0/rnnmon")
    assert status == 200 and plugin.workers_summarized == 257  # that worker only
    assert changed["heatmap"]["bin_s"] > body["heatmap"]["bin_s"]  # its new steps widen the job's span
    assert changed["workers"][0]["worker"] == "worker-37"


def test_workers_reads_each_worker_for_the_figures_it_compares_alone(tmp_path):
    # The first /workers of a 2,000-worker job cost 14.7 s of CPU (3 s wanted): each worker was summarized in full,
    # every table decoded and its digest built, 7 ms a worker. It computes the straggler search's figures alone.
    start = time.time() - 600
    for index in range(8):  # worker-3 waits 10 ms more per step for its input
        write_gpu_run(str(tmp_path / "job" / f"worker-{index}" / "rnnmon"), 6, start=start, gpus=2,
                      wait_s=0.016 if index == 3 else 0.006)
    plugin, client = served_plugin(str(tmp_path))
    calls: dict[tuple[str, str], int] = {}

    def seen(frame, event, arg):
        if event == "call":
            key = (os.path.basename(frame.f_code.co_filename), frame.f_code.co_name)
            calls[key] = calls.get(key, 0) + 1

    sys.setprofile(seen)
    try:
        status, body = get(client, "workers", run="job/worker-0/rnnmon")
    finally:
        sys.setprofile(None)
    assert status == 200 and body["straggler"] == "worker-3" and plugin.workers_summarized == 8
    assert calls.get(("worker_figures.py", "worker_figures")) == 8
    built = {key: count for key, count in calls.items() if key in {("summary.py", "summarize"), ("digest.py", "of"),
                                                                   ("digest.py", "add"), ("fit_time.py", "fit_time")}}
    assert built == {}, built  # no summary, no digest
    # a table checked per worker: its steps, phases and 2 GPUs' samples; never its gaps nor the GPUs' stats
    assert calls.get(("decode.py", "check_rows")) == 8 * 4
    assert sum(calls.values()) / 8 < 1500, sum(calls.values()) / 8  # Python calls a worker: 900 (2,400 summarized)


def test_workers_answers_a_worker_with_infinite_waits_in_tensorboards_json(tmp_path):
    # /workers is written as JSON directly unless its answer holds what JSON cannot (infinite input waits, which the
    # format allows, have a NaN median): that answer goes through TensorBoard's cleansing, as every answer did.
    for index in range(3):
        write_gpu_run(str(tmp_path / "job" / f"worker-{index}" / "rnnmon"), 3)
    t0 = time.time() - 60
    writer = SummaryWriter(str(tmp_path / "job" / "worker-3" / "rnnmon"))
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "finished", "start": t0})
    writer.table(schema.STEPS_TAG, [(i + 1, 0, t0 + i, t0 + i + 0.5, np.inf, np.nan if i == 0 else 1.0, 1)
                                    for i in range(15)])
    writer.close()
    status, body = get(plugin_client(str(tmp_path)), "workers", run="job/worker-0/rnnmon")
    assert status == 200 and {row["worker"]: row["input_wait_ms"] for row in body["workers"]}["worker-3"] == "NaN"


def test_trials_of_a_search_are_listed_by_trial_with_their_hyperparameters(tmp_path):
    for trial_id, units in (("0", 8), ("1", 32)):
        trial = {"id": trial_id, "search": "lstm", "hyperparameters": {"units": units}}
        write_gpu_run(str(tmp_path / f"trial_{trial_id}" / "rnnmon"), 3, info={"trial": trial})
    client = plugin_client(str(tmp_path))
    assert [run["name"] for run in get(client, "runs")[1]["runs"]] == ["trial_0", "trial_1"]
    status, summary = get(client, "summary", run="trial_1/rnnmon")
    assert status == 200 and summary["trial"] == {"id": "1", "search": "lstm", "hyperparameters": {"units": 32}}


def test_running_run_is_live_then_stalled(tmp_path):
    write_gpu_run(str(tmp_path / "now" / "rnnmon"), 3, status="running")
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    tb_context = base_plugin.TBContext(data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path)))
    plugins = [RnnmonPlugin(tb_context, live_window_s=window) for window in (plugin_module.LIVE_WINDOW_S, -1.0)]
    status = [plugin.runs_impl(context.RequestContext(), "")["runs"][0]["status"] for plugin in plugins]
    assert status == ["live", "stalled"]


def test_timeline_of_a_cpu_fit(client):
    status, body = get(client, "timeline", run="cpu_fit/rnnmon")
    assert status == 200
    steps = body["steps"]
    assert steps["total"] == 29 and not steps["downsampled"]  # 30 steps; the first is the warm-up phase
    assert steps["step"] == list(range(2, 31))
    assert all(w > 0 for w in steps["input_wait_ms"]) and all(c > 0 for c in steps["compute_ms"])
    assert body["gpus"] == []
    assert set(body["gaps"]["device"]) <= {None}  # gaps from step phases, no device
    assert "warmup" in body["phases"]["kind"]
    assert min(steps["time"]) >= 0 and max(steps["time"]) <= body["extent"]["end"]


def test_timeline_has_profile_phases_and_the_chart_draws_every_phase_kind(tmp_path):
    write_gpu_run(str(tmp_path / "profiled" / "rnnmon"), 3, profile_at=0.05)
    status, body = get(plugin_client(str(tmp_path)), "timeline", run="profiled/rnnmon")
    assert status == 200 and "profile" in body["phases"]["kind"], body["phases"]
    [drawn] = re.findall(r"const PHASE_COLORS = \{(.*?)\};", _scripts()["chart.js"], re.S)
    assert set(re.findall(r"(\w+): \"rgba", drawn)) == set(schema.PHASE_KINDS)  # a colour for each band


def test_timeline_of_a_gpu_fit_has_utilization_and_idle_gaps(client):
    status, body = get(client, "timeline", run="gpu_fit/rnnmon")
    assert status == 200
    (gpu,) = body["gpus"]
    assert gpu["index"] == 0 and gpu["name"] == "NVIDIA H200"
    assert 0.0 in gpu["util"]["value"] and 90.0 in gpu["util"]["value"]
    assert gpu["sm_activity"]["total"] > 0
    assert body["gaps"]["total"] >= 1 and set(body["gaps"]["device"]) == {0}


def test_timeline_of_a_gpu_without_gpm_has_utilization_and_no_sm_activity(client):
    status, body = get(client, "timeline", run="no_gpm_fit/rnnmon")
    assert status == 200, body
    (gpu,) = body["gpus"]
    assert gpu["util"]["total"] > 0 and gpu["sm_activity"] is None


@pytest.mark.parametrize("window", [{"start": "100000", "end": "200000"}, {"start": "1e308"},
                                    {"start": "-5", "end": "-1"}])
def test_timeline_of_a_window_without_data_is_empty(client, window):
    for run in ("cpu_fit/rnnmon", "long/rnnmon"):
        status, body = get(client, "timeline", run=run, **window)
        assert status == 200, body
        assert body["steps"]["total"] == 0 and body["steps"]["time"] == []
        assert all(len(gpu["util"]["time"]) <= 1 for gpu in body["gpus"])  # the neighbour that reaches the edge


def test_timeline_range_and_points_downsample_with_extremes(client):
    status, full = get(client, "timeline", run="long/rnnmon", points=20000)
    util = full["gpus"][0]["util"]
    assert util["total"] == CHUNKS * 12 and not util["downsampled"]
    status, body = get(client, "timeline", run="long/rnnmon", points=100)
    thin = body["gpus"][0]["util"]
    assert status == 200 and thin["downsampled"] and len(thin["value"]) <= 100
    assert min(thin["value"]) == 0.0  # the one-sample dip survives
    assert max(thin["value"]) == max(util["value"])
    assert len(body["steps"]["time"]) <= 100
    gaps = body["gaps"]
    assert gaps["total"] == CHUNKS and gaps["binned"] and len(gaps["start"]) <= 50
    assert min(gaps["share"]) > 0 and max(gaps["share"]) < 0.5  # one 1/6 s gap per 2 s chunk: binned, not solid
    assert not full["gaps"]["binned"] and set(full["gaps"]["share"]) == {1.0}
    start, end = 40.0, 60.0
    status, zoomed = get(client, "timeline", run="long/rnnmon", start=start, end=end, points=100)
    times = zoomed["steps"]["time"]
    assert zoomed["range"] == {"start": start, "end": end}
    assert times and start - 1 <= min(times) and max(times) <= end
    assert zoomed["steps"]["total"] < full["steps"]["total"]


def test_summary_is_summarize_output(client, logdir):
    status, body = get(client, "summary", run="gpu_fit/rnnmon")
    assert status == 200
    provider, ctx = open_logdir(logdir)
    expected = summarize(read_runs(provider, ctx, runs=["gpu_fit/rnnmon"])["gpu_fit/rnnmon"])
    for key in ("verdict", "steps", "input_wait_fraction", "host_gap_fraction", "step_ms", "findings", "alerts"):
        assert body[key] == json.loads(json.dumps(expected[key])), key
    assert body["gpus"][0]["idle_fraction"] > 0.2
    assert body["idle_gap_count"] == expected["idle_gap_count"] >= len(body["idle_gaps"])
    assert body["verdict_text"].startswith(body["verdict"].split("-")[0])
    assert body["name"] == "gpu_fit"


def test_summary_gives_the_verdicts_words_and_advice(client, tmp_path):
    status, body = get(client, "summary", run="gpu_fit/rnnmon")
    assert status == 200 and body["verdict"] == "input-bound"
    assert body["verdict_text"] == verdict.LABELS["input-bound"]
    assert body["verdict_advice"] == verdict.ADVICE["input-bound"]
    write_gpu_run(str(tmp_path / "short" / "rnnmon"), 1)  # 5 steps: too few for a verdict
    status, short = get(plugin_client(str(tmp_path)), "summary", run="short/rnnmon")
    assert status == 200 and short["verdict"] == "insufficient-data"
    assert short["verdict_text"] == f"insufficient data: fewer than {verdict.MIN_STEPS} steps"
    assert "verdict_advice" in short and short["verdict_advice"] is None


@pytest.mark.parametrize(("params", "message"), [
    ({}, "Missing required parameter: run"),
    ({"run": "long/rnnmon", "start": "soon"}, "start must be a number"),
    ({"run": "long/rnnmon", "end": "nan"}, "end must be a number"),
    ({"run": "long/rnnmon", "start": "5", "end": "1"}, "start must be less than end"),
    ({"run": "long/rnnmon", "points": "3"}, "points must be an integer from 10"),
    ({"run": "long/rnnmon", "points": "many"}, "points must be an integer from 10"),
    ({"run": "long/rnnmon", "points": "²²"}, "points must be an integer from 10"),  # int() would take it
    ({"run": "long/rnnmon", "points": "1" * 5000}, "points must be an integer from 10"),
])
def test_bad_timeline_input_is_400(client, params, message):
    status, body = get(client, "timeline", **params)
    assert status == 400 and message in body


def test_unknown_run_is_404(client):
    for route in ("timeline", "summary"):
        status, body = get(client, route, run="nope/rnnmon")
        assert status == 404 and "nope/rnnmon" in body


def test_unreadable_run_fails_alone(client):
    for run in ("unreadable/rnnmon", "bad_description/rnnmon"):
        for route in ("timeline", "summary"):
            status, body = get(client, route, run=run)
            assert status == 422 and "unreadable rnnmon data" in body and run in body
    assert get(client, "timeline", run="long/rnnmon")[0] == 200
    assert get(client, "runs")[0] == 200
    status, body = get(client, "timeline", run="truncated/rnnmon")  # the tab reads the files: it sees the cut,
    assert status == 200 and "truncated" in body["notes"][0] and body["steps"]["total"]  # and draws what it holds
    runs = {run["run"]: run for run in get(client, "runs")[1]["runs"]}
    assert "truncated" in runs["truncated/rnnmon"]["notes"][0] and not runs["truncated/rnnmon"]["errors"]
    assert not runs["long/rnnmon"]["errors"]


def test_a_copied_event_file_counts_once_in_the_report_and_the_tab(logdir, tmp_path):
    # A real fit's event file copied beside itself (a restored backup, a sync tool): every step counted once, and
    # the run says that two of its files cover the same steps.
    shutil.copytree(os.path.join(logdir, "cpu_fit"), tmp_path / "cpu_fit")
    run_dir = tmp_path / "cpu_fit" / "rnnmon"
    status, alone = get(plugin_client(str(tmp_path)), "summary", run="cpu_fit/rnnmon")
    assert status == 200 and alone["steps"] > 20
    (name,) = [name for name in os.listdir(run_dir) if "tfevents" in name]
    shutil.copyfile(run_dir / name, run_dir / (name + ".copy"))
    client = plugin_client(str(tmp_path))
    status, both = get(client, "summary", run="cpu_fit/rnnmon")
    assert status == 200 and both["steps"] == alone["steps"] and both["errors"] == []
    assert alone["notes"] == []
    assert len(both["notes"]) == 1 and "a copy of the file" in both["notes"][0] and name in both["notes"][0]
    (listed,) = get(client, "runs")[1]["runs"]
    assert listed["errors"] == [] and listed["notes"] and "a copy of the file" in listed["notes"][0]
    report = build_report(str(tmp_path))
    assert report["runs"][0]["steps"] == alone["steps"]
    assert "  note           " + both["notes"][0] in render_text(report)


def _scripts() -> dict[str, str]:
    """The tab's JavaScript modules by name."""
    folder = plugin_module.STATIC_DIR
    return {name: open(os.path.join(folder, name), encoding="utf-8").read()
            for name in os.listdir(folder) if name.endswith(".js")}


def test_static_files_and_plotly_bundle(client):
    response = client.get(ROUTE + "index.js")
    assert response.status_code == 200 and response.mimetype == "text/javascript"
    assert b"export async function render" in response.get_data()
    scripts = _scripts()
    imported = {name for text in scripts.values() for name in re.findall(r'from\s+"\./([\w.]+)"', text)}
    assert imported == set(scripts) - {"index.js"}  # each module is imported by another, and is there
    for module in imported:
        response = client.get(ROUTE + module)
        assert response.status_code == 200 and response.mimetype == "text/javascript"
        assert b"export function" in response.get_data()
    assert client.get(ROUTE + "style.css").mimetype == "text/css"
    response = client.get(ROUTE + "plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert response.headers["Content-Encoding"] == "gzip"
    with open(plotly_bundle.bundle_path(), "rb") as f:  # the partial bundle where it was fetched, else the full one
        assert gzip.decompress(response.get_data()) == f.read()
    assert response.get_data() == plotly_bundle.gzipped()  # a fetched bundle as stored gzipped


def test_the_partial_plotly_bundle_is_served_when_fetched_and_checked_before_it_is_kept(tmp_path):
    """The tab loads npm's cartesian bundle (1.5 MB) where it was fetched, else the plotly package's (4.8 MB); the
    fetch takes the full bundle's version, keeps nothing whose digest the registry does not vouch for, and keeps it
    gzipped as served."""
    vendor = str(tmp_path / "vendor")
    full = plotly_bundle.full_bundle()
    assert plotly_bundle.bundle_path(vendor) == full
    with open(full, "rb") as f:
        assert gzip.decompress(plotly_bundle.gzipped(vendor)) == f.read()
    wanted = plotly_bundle.version(full)
    script = f"/**\n* plotly.js (cartesian - minified) v{wanted}\n*/\nvar Plotly = {{}};\n".encode()
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as archive:
        info = tarfile.TarInfo(f"package/{plotly_bundle.PARTIAL}")
        info.size = len(script)
        archive.addfile(info, io.BytesIO(script))
    files = {f"/{plotly_bundle.PACKAGE}/-/bundle.tgz": tarball.getvalue()}
    asked = []

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()  # shutdown() waits a poll
    registry = f"http://127.0.0.1:{server.server_port}"
    try:
        for digest in (hashlib.sha512(b"another tarball").digest(), hashlib.sha512(tarball.getvalue()).digest()):
            files[f"/{plotly_bundle.PACKAGE}/{wanted}"] = json.dumps({"dist": {
                "tarball": f"{registry}/{plotly_bundle.PACKAGE}/-/bundle.tgz",
                "integrity": "sha512-" + base64.b64encode(digest).decode()}}).encode()
            if digest != hashlib.sha512(tarball.getvalue()).digest():
                with pytest.raises(RuntimeError, match="digest"):
                    plotly_bundle.fetch(vendor, registry)
                assert plotly_bundle.bundle_path(vendor) == full  # nothing kept
        path = plotly_bundle.fetch(vendor, registry)
    finally:
        server.shutdown()
    assert asked[0] == f"/{plotly_bundle.PACKAGE}/{wanted}"
    with open(path, "rb") as f:
        assert plotly_bundle.bundle_path(vendor) == path and f.read() == script
    with open(f"{path}.gz", "rb") as f:  # kept gzipped: served as stored, never compressed at a request
        assert plotly_bundle.gzipped(vendor) == f.read() and gzip.decompress(plotly_bundle.gzipped(vendor)) == script


def test_no_javascript_copies_what_the_routes_serve():
    """A run's job, a worker's order, the words for gap causes and phases, the thresholds file's name and reach, the
    rules and the verdict's advice come from the routes; no module of the tab keeps its own copy."""
    rules = Thresholds.schema()
    copies = ["WORKER_RUN", "evaluator", "REACH_LEVELS", THRESHOLDS_FILE, "VERDICT_ADVICE", '"input-bound"',
              "lastIndexOf(\"-\")", 'split("/")',
              *(f'"{label}"' for label in [*CAUSE_LABELS.values(), *PHASE_LABELS.values()]),
              *(spec["label"] for spec in rules.values()), *(spec["help"] for spec in rules.values())]
    for name, text in _scripts().items():
        assert [copy for copy in copies if copy in text] == [], name
        named = [rule for rule in rules if rule in text]
        assert len(named) <= 1, (name, named)  # chart.js draws gpu_util_low's line; a table would name them all


def test_listed_as_an_active_iframe_tab(client):
    listing = client.get("/data/plugins_listing").get_json()["rnnmon"]
    assert listing["enabled"] and listing["tab_name"] == "RNN Monitor"
    assert listing["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/rnnmon/index.js"}


# --- alert thresholds: GET /thresholds, POST /thresholds -------------------------------------------------------
SAVE = {"X-Rnnmon-Request": "save", "X-Rnnmon-Version": "none"}  # "none": there is no file yet
RAISED = {"gpu_util_low": {"enabled": True, "pct": 80, "resolve_pct": 85, "for_s": 1.0},
          "idle_gap": {"enabled": False, "min_s": 5.0}}


def thresholds_client(logdir: str) -> werkzeug_test.Client:
    """The plugin with TensorBoard's log directory `logdir` (it holds no runs; only the thresholds file matters)."""
    provider = data_provider.MultiplexerDataProvider(plugin_event_multiplexer.EventMultiplexer(), logdir)
    plugin = RnnmonPlugin(base_plugin.TBContext(logdir=logdir, data_provider=provider))
    return werkzeug_test.Client(application.TensorBoardWSGI([plugin], data_provider=provider))


def post(client, body, headers=SAVE, content_type="application/json", **kwargs):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    response = client.post(ROUTE + "thresholds", data=data, headers=headers, content_type=content_type, **kwargs)
    return response.status_code, (response.get_json() if response.is_json else response.get_data(as_text=True))


class CountingStream(io.BytesIO):
    """A request body that counts the bytes the server read from it."""

    read_bytes = 0

    def read(self, size=-1):
        out = super().read(size)
        self.read_bytes += len(out)
        return out

    def readinto(self, buffer):
        count = super().readinto(buffer)
        self.read_bytes += count
        return count


def test_thresholds_default_until_a_file_is_saved(tmp_path):
    client = thresholds_client(str(tmp_path))
    status, body = get(client, "thresholds")
    assert status == 200
    assert body["source"] == "defaults" and body["thresholds"] == Thresholds().to_dict()
    assert body["path"] == str(tmp_path / THRESHOLDS_FILE)
    assert body["writable"] and body["reason"] is None and body["error"] is None
    assert body["defaults"] == Thresholds().to_dict()
    assert os.listdir(tmp_path) == []  # reading, and checking that saving would work, writes nothing

    saved = Thresholds.from_dict({"input_wait_high": {"pct": 40, "resolve_pct": 30}})
    save_thresholds_file(tmp_path / THRESHOLDS_FILE, saved)
    status, body = get(client, "thresholds")
    assert body["source"] == "file" and body["thresholds"] == saved.to_dict()


def test_thresholds_file_that_cannot_be_used_is_reported(tmp_path):
    (tmp_path / THRESHOLDS_FILE).write_text('{"gpu_util_low": {"pct": 150}}')
    status, body = get(thresholds_client(str(tmp_path)), "thresholds")
    assert status == 200 and body["source"] == "defaults" and body["thresholds"] == Thresholds().to_dict()
    assert "gpu_util_low.pct" in body["error"] and "150" in body["error"] and body["writable"]


def test_thresholds_serve_the_rule_schema_and_the_reach_python_declares(tmp_path):
    body = get(thresholds_client(str(tmp_path)), "thresholds")[1]
    assert body["rules"] == json.loads(json.dumps(Thresholds.schema()))
    assert [key["key"] for key in body["rules"]["step_time_regression"]["keys"]] == [
        "enabled", "ratio", "resolve_ratio", "baseline_steps", "for_s"]
    assert body["rules"]["idle_gap"]["unit"] == " s" and body["rules"]["gpu_throttled"]["keys"][-1]["choices"] == [
        "sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"]
    followed = thresholds_files(str(tmp_path / "a" / "b" / "c" / "d"), root=str(tmp_path))  # d, c, b, a: not the root
    assert body["levels_up"] == LEVELS_UP == len(followed) - 1
    assert body["file_name"] == THRESHOLDS_FILE == os.path.basename(body["path"])


def test_post_saves_the_thresholds_file(tmp_path):
    client = thresholds_client(str(tmp_path))
    status, body = post(client, RAISED)
    assert status == 200 and body["source"] == "file"
    expected = Thresholds.from_dict(RAISED)
    assert load_thresholds_file(tmp_path / THRESHOLDS_FILE) == expected  # what a monitor will load
    assert body["thresholds"] == expected.to_dict() == get(client, "thresholds")[1]["thresholds"]
    assert os.listdir(tmp_path) == [THRESHOLDS_FILE]  # one file, no temporary left behind
    status, body = post(client, {}, headers={"x-rnnmon-request": "Save", "x-rnnmon-version": body["version"]})
    # header names are case-insensitive
    assert status == 200 and load_thresholds_file(tmp_path / THRESHOLDS_FILE) == Thresholds()


@pytest.mark.parametrize(("body", "headers", "content_type", "code", "message"), [
    (RAISED, {}, "application/json", 403, "needs the header X-Rnnmon-Request: save"),
    (RAISED, {"X-Rnnmon-Request": "yes"}, "application/json", 403, "X-Rnnmon-Request"),
    ("gpu_util_low=80", {}, "application/x-www-form-urlencoded", 403, "X-Rnnmon-Request"),  # a cross-site form
    (RAISED, {"X-Rnnmon-Request": "save"}, "application/json", 428, "needs the header X-Rnnmon-Version"),
    (RAISED, {**SAVE, "X-Rnnmon-Version": " "}, "application/json", 428, "X-Rnnmon-Version"),
    (RAISED, SAVE, "text/plain", 415, "takes JSON: send Content-Type: application/json. Received: text/plain"),
    ("{not json", SAVE, "application/json", 400, "the body is not valid JSON"),
    ({"gpu_util_low": {"pct": 80, "resolve_pct": 70}}, SAVE, "application/json", 400,
     "gpu_util_low.resolve_pct must be in [80, 100] (at least pct). Received: 70"),
    ({"gpu_util_low": {"pct": "high"}}, SAVE, "application/json", 400,
     "gpu_util_low.pct must be a finite number. Received: 'high'"),
    ({"step_time_regression": {"baseline_steps": 2.5}}, SAVE, "application/json", 400,
     "step_time_regression.baseline_steps must be an integer. Received: 2.5"),
    ({"gpu_util_high": {}}, SAVE, "application/json", 400, "Unknown key(s) in thresholds: gpu_util_high"),
    ([1, 2], SAVE, "application/json", 400, "thresholds must be a JSON object. Received: [1, 2]"),
])
def test_post_refuses_and_writes_nothing(tmp_path, body, headers, content_type, code, message):
    status, text = post(thresholds_client(str(tmp_path)), body, headers=headers, content_type=content_type)
    assert status == code and message in text
    assert os.listdir(tmp_path) == []


def test_post_refuses_a_large_body_without_reading_it(tmp_path):
    client = thresholds_client(str(tmp_path))
    body = CountingStream(b" " * 1_000_000)
    response = client.post(ROUTE + "thresholds", input_stream=body, headers=SAVE, content_type="application/json")
    assert response.status_code == 413 and "at most 16384 bytes" in response.get_data(as_text=True)
    assert body.read_bytes == 0  # refused on Content-Length alone
    body = CountingStream(b" " * 1_000_000)  # chunked: no Content-Length, so read one byte past the limit
    response = client.post(ROUTE + "thresholds", input_stream=body, content_type="application/json",
                           headers={**SAVE, "Transfer-Encoding": "chunked"},
                           environ_overrides={"wsgi.input_terminated": True})
    assert response.status_code == 413 and body.read_bytes <= 16 * 1024 + 1
    assert os.listdir(tmp_path) == []


def test_other_methods_are_405(tmp_path):
    response = thresholds_client(str(tmp_path)).put(ROUTE + "thresholds", json=RAISED, headers=SAVE)
    assert response.status_code == 405 and "POST" in response.headers["Allow"]


@pytest.fixture
def read_only_mount(tmp_path):
    """A folder on a read-only file system (a tmpfs mounted `ro`), which stops root too; skipped without mount."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    mounted = shutil.which("mount") and os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("mounting a read-only tmpfs needs root with CAP_SYS_ADMIN")
    try:
        yield str(folder)
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("case", ["path_is_a_folder", "read_only_mount", "remote", "logdir_spec"])
def test_unwritable_log_directory_is_reported_and_refused(tmp_path, request, case):
    """Each case stops root too; `chmod 555` would not (root writes through it, and so may the tab)."""
    if case == "path_is_a_folder":  # the atomic replace cannot put a file where a folder is
        logdir, target = str(tmp_path), tmp_path / THRESHOLDS_FILE
        target.mkdir()
        reason = f"{target} exists and is not a file"
    elif case == "read_only_mount":
        logdir = request.getfixturevalue("read_only_mount")
        reason = f"log directory is read-only: {logdir} (a read-only file system)"
    elif case == "remote":
        logdir, reason = "gs://bucket/runs", "log directory is not a local folder, so the tab does not write to it"
    else:
        logdir, reason = "", "it was started with --logdir_spec"
    client = thresholds_client(logdir)
    status, body = get(client, "thresholds")
    assert status == 200 and not body["writable"] and reason in body["reason"]
    assert body["source"] == "defaults" and body["thresholds"] == Thresholds().to_dict()
    status, text = post(client, RAISED)
    assert status == 409 and reason in text
    if case == "path_is_a_folder":
        assert os.listdir(tmp_path) == [THRESHOLDS_FILE] and os.listdir(target) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_a_write_that_fails_anyway_is_409():
    """/proc passes every check (root may write there by its permission bits) but takes no new file."""
    status, text = post(thresholds_client("/proc/self"), RAISED)
    assert status == 409 and "/proc/self" in text


# --- samples_per_plugin ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("logdir", "given", "expected"), [
    ("hdfs://namenode/runs", {}, {"rnnmon": 0}),
    ("", {"images": 5}, {"images": 5, "rnnmon": 0}),  # --logdir_spec
    ("hdfs://namenode/runs", {"rnnmon": 10}, {"rnnmon": 10}),
    ("gs://bucket/runs", {}, {}),  # read from rnnmon's mirror, as a local folder (docs/storage.md)
    ("runs", {"images": 5}, {"images": 5}),  # local: the tab reads the files, TensorBoard need not keep them
])
def test_loader_keeps_all_rnnmon_samples_where_the_tab_reads_the_provider(logdir, given, expected):
    flags = argparse.Namespace(logdir=logdir, samples_per_plugin=dict(given))
    RnnmonLoader().fix_flags(flags)
    assert flags.samples_per_plugin == expected


@pytest.mark.parametrize(("given", "expected"), [(5.0, 2.0), (30.0, 30.0), (0.5, 0.5)])
def test_loader_reloads_every_2_s_unless_told_otherwise(given, expected):
    flags = argparse.Namespace(samples_per_plugin={}, reload_interval=given)
    RnnmonLoader().fix_flags(flags)
    assert flags.reload_interval == expected


def test_loader_keeps_tensorboards_reload_interval_for_a_remote_log_directory():
    """At 2 s, TensorBoard's own reading of a `gs://` log directory cost about 10,700 LISTs an hour."""
    flags = argparse.Namespace(logdir="gs://bucket/runs", samples_per_plugin={}, reload_interval=5.0)
    RnnmonLoader().fix_flags(flags)
    assert flags.reload_interval == 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def long_logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("long")
    write_gpu_run(str(root / "long" / "rnnmon"), CHUNKS)
    return str(root)


@pytest.mark.parametrize("flags", [
    [],  # default flags: the Rust data server ("auto")
    ["--load_fast=false"],  # the Python loader
    ["--samples_per_plugin=rnnmon=10"],  # a local log directory: the tab reads the files, whatever TensorBoard keeps
])
@pytest.mark.slow
def test_real_tensorboard_serves_every_chunk(long_logdir, flags):
    port = _free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", long_logdir, "--port", str(port),
               "--host", "127.0.0.1", *flags]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/data/plugin/rnnmon/timeline?run=long/rnnmon&points=20000"
    try:
        deadline, body = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url) as response:
                    body = json.load(response)
                if body["gpus"] and body["gpus"][0]["util"]["total"] >= CHUNKS * 12:
                    break
            except OSError:
                pass  # not up yet, or the run is not loaded yet (404)
            time.sleep(0.3)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert body is not None, "tensorboard never served the run"
    assert body["gpus"][0]["util"]["total"] == CHUNKS * 12
    assert body["steps"]["total"] == CHUNKS * 5 - 1  # the first step is the warm-up phase


@pytest.mark.parametrize(("body", "message"), [
    ('{"gpu_util_low": {"pct": 1' + "0" * 400 + "}}", "gpu_util_low.pct must be a finite number"),
    ("[" * 10_000 + "]" * 10_000, "nested too deeply"),
    ('{"gpu_util_low": {"pct": ' + "[" * 3000 + "]" * 3000 + "}}", "nested too deeply"),
])
def test_post_huge_numbers_and_deep_nesting_are_400(tmp_path, body, message):
    status, answer = post(thresholds_client(str(tmp_path)), body[:16_000])
    assert status == 400 and message in answer, answer
    assert not (tmp_path / THRESHOLDS_FILE).exists()


def test_a_save_without_the_version_header_is_428_and_overwrites_nothing(tmp_path):
    # A client that does not say which version it edits used to overwrite the file unconditionally.
    client = thresholds_client(str(tmp_path))
    status, saved = post(client, RAISED)
    assert status == 200
    status, answer = post(client, {}, headers={"X-Rnnmon-Request": "save"})
    assert status == 428 and "X-Rnnmon-Version" in answer and '"none"' in answer
    assert load_thresholds_file(tmp_path / THRESHOLDS_FILE) == Thresholds.from_dict(RAISED)
    assert get(client, "thresholds")[1]["version"] == saved["version"]


def test_stale_save_is_409_and_writes_nothing(tmp_path):
    client = thresholds_client(str(tmp_path))
    loaded = get(client, "thresholds")[1]["version"]
    assert loaded == "none"
    status, first = post(client, RAISED, headers={**SAVE, "X-Rnnmon-Version": loaded})  # tab 1 saves
    assert status == 200 and first["version"] != loaded
    status, answer = post(client, {}, headers={**SAVE, "X-Rnnmon-Version": loaded})  # tab 2 edits the old one
    assert status == 409 and "changed elsewhere" in answer
    assert load_thresholds_file(tmp_path / THRESHOLDS_FILE) == Thresholds.from_dict(RAISED)
    status, _ = post(client, {}, headers={**SAVE, "X-Rnnmon-Version": first["version"]})  # after a reload
    assert status == 200


@pytest.mark.parametrize(("headers", "allowed"), [
    ({"Host": "evil.example"}, False),
    ({"Host": "evil.example:6006"}, False),
    ({"Host": "localhost:6006", "Origin": "http://evil.example"}, False),
    ({"Host": "127.0.0.1:6006"}, True),
    ({"Host": "[::1]:6006", "Origin": "http://[::1]:6006"}, True),
    ({"Host": "localhost:6006", "Origin": "http://localhost:6006"}, True),
])
def test_save_checks_host_and_origin_against_dns_rebinding(tmp_path, headers, allowed):
    status, answer = post(thresholds_client(str(tmp_path)), RAISED, headers={**SAVE, **headers})
    assert (status == 200) == allowed, answer
    assert (tmp_path / THRESHOLDS_FILE).exists() == allowed
    if not allowed:
        assert status == 403 and "refuses" in answer
        assert ("RNNMON_ALLOWED_HOSTS" in answer) == ("Origin" not in headers)  # how to allow a host name


def test_get_refuses_a_symlinked_file_without_echoing_it(tmp_path):
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps({"token": "s3cr3t-value"}))
    (tmp_path / THRESHOLDS_FILE).symlink_to(secret)
    status, body = get(thresholds_client(str(tmp_path)), "thresholds")
    assert status == 200 and "symbolic link" in body["error"] and body["source"] == "defaults"
    assert "s3cr3t" not in json.dumps(body) and "token" not in json.dumps(body)
