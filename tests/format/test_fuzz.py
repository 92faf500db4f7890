"""Fuzzing for a bounded time: damaged event files through the reader and report, random queries through the routes.

Damage comes in two kinds: raw (bit flips, cuts, inserted bytes: the checksum walk must catch them) and
checksummed (records mutated, then framed again with valid CRCs: the value checks must catch them). Nothing may
raise out of `read_logdir`, `build_report` or `render_text`, and no route may answer 500.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import time
import urllib.parse

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2

from rnnmon.format import schema
from rnnmon.format.eventfile import frame, scan_records
from rnnmon.format.logdir import read_logdir
from rnnmon.format.writer import SummaryWriter
from rnnmon.report import build_report, render_text

FUZZ_S = float(os.environ.get("RNNMON_FUZZ_S", "8"))  # per test; raise it for a longer hunt
# A second of another seed keeps each test in the fast loop (-m "not slow"); the hunt runs in the full suite.
BUDGETS = [pytest.param(0.5, 12, id="quick"), pytest.param(FUZZ_S, 13, id="hunt", marks=pytest.mark.slow)]
T0 = 1_790_000_000.0


def _healthy_run(run_dir: str) -> None:
    writer = SummaryWriter(run_dir)
    writer.json(schema.RUN_TAG, {"status": "finished", "start": T0, "pid": 1, "backend": "tensorflow", "idle_pct": 5.0})
    for chunk in range(3):
        begin = T0 + chunk + np.arange(50) * 0.02
        steps = np.column_stack([chunk * 50 + np.arange(1, 51), np.zeros(50), begin, begin + 0.018,
                                 np.full(50, 3.0), np.full(50, 2.0), np.ones(50)])
        steps[0, 5] = np.nan
        writer.table(schema.STEPS_TAG, steps)
        times = T0 + chunk + np.arange(6) / 6
        writer.table(f"{schema.UTIL_TAG_PREFIX}0", np.column_stack([times, [90, 0, 80, 85, 0, 95]]),
                     device={"index": 0, "name": "GPU"})
        stats = np.full((2, len(schema.STAT_COLUMNS)), 50.0)
        stats[:, 0] = times[:2]
        writer.table(f"{schema.STATS_TAG_PREFIX}0", stats, device={"index": 0, "name": "GPU"})
        writer.table(schema.GAPS_TAG, [[0, times[1], times[2], 0], [0, times[4], times[5], 1]])
        writer.table(schema.HOST_TAG, [[times[0], 40.0]])
        writer.json(schema.ALERTS_TAG, [{"rule": "idle_gap", "device": 0, "state": "firing", "start": times[1]}])
        writer.json(schema.SHAPES_TAG, [{"step": int(steps[0, 0]), "time": steps[0, 2], "shapes": [[32, 16], None]}])
        writer.flush()
    writer.table(schema.PHASES_TAG, [[0, T0 + 3, T0 + 3.5]])
    writer.json(schema.FINDINGS_TAG, [{"code": "INPUT_BOUND", "severity": "warning", "where": "x", "message": "m",
                                       "advice": "a"}])
    writer.close()


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("flip", "cut", "insert", "zero", "duplicate"))
        at = rng.randrange(max(1, len(data)))
        if kind == "flip" and data:
            data[at] ^= 1 << rng.randrange(8)
        elif kind == "cut":
            del data[at: at + rng.randint(1, 64)]
        elif kind == "insert":
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif kind == "zero":
            data[at: at + 8] = bytes(len(data[at: at + 8]))
        else:
            data[at:at] = data[at: at + rng.randint(1, 64)]
    return bytes(data)


def _mutate_event(rng: random.Random, record: bytes) -> bytes:
    """A structurally plausible but wrong event: changed dtypes, shapes, packed headers, documents."""
    event = event_pb2.Event.FromString(record)
    for value in event.summary.value:
        tensor = value.tensor
        choice = rng.randrange(6)
        if choice == 0:
            tensor.dtype = rng.choice((0, 1, 2, 3, 7, 9, 19, 99))
        elif choice == 1:
            del tensor.tensor_shape.dim[:]
            for _ in range(rng.randint(0, 3)):
                tensor.tensor_shape.dim.add(size=rng.choice((0, 1, 7, 2**31, 10**12, -1)))
        elif choice == 2 and tensor.string_val:
            tensor.string_val[0] = _mutate_bytes(rng, tensor.string_val[0])
        elif choice == 3 and tensor.string_val:
            tensor.string_val[0] = rng.choice((b"[]", b"{}", b"null", b"[1, {}]", b'{"status": []}', b"NaN",
                                               b"[" * 5000, b'[{"severity": 1}]', b"\xff\xfe"))
        elif choice == 4:
            tensor.double_val[:] = [rng.choice((0.0, float("nan"), float("inf"), -1.0, 1e308))]
        else:
            value.tag = rng.choice((schema.STEPS_TAG, schema.GAPS_TAG, schema.PHASES_TAG, schema.HOST_TAG,
                                    schema.RUN_TAG, schema.ALERTS_TAG, schema.SHAPES_TAG, "rnnmon/util/gpu",
                                    "rnnmon/stats/gpu-1", "rnnmon/util/gpu99"))
    return event.SerializeToString()


def _damage(rng: random.Random, path: str, pristine: bytes) -> None:
    if rng.random() < 0.5:
        damaged = _mutate_bytes(rng, pristine)
    else:  # checksums intact: only the value checks stand between the damage and the tables
        out = []
        for record in _records(pristine):
            try:
                out.append(_mutate_event(rng, record) if rng.random() < 0.3 else record)
            except Exception:  # a record the mutator cannot parse stays as it was
                out.append(record)
        damaged = b"".join(frame(record) for record in out)
    with open(path, "wb") as f:
        f.write(damaged)
    os.utime(path, (time.time() - 60, time.time() - 60))


def _records(data: bytes) -> list[bytes]:
    import tempfile

    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        return scan_records(f.name).records


@pytest.fixture
def damaged_logdir(tmp_path):
    for name in ("a", "b", "c"):
        _healthy_run(str(tmp_path / name / "rnnmon"))
    files = [os.path.join(d, n) for d, _, names in os.walk(tmp_path) for n in names if "tfevents" in n]
    return tmp_path, {path: pathlib.Path(path).read_bytes() for path in files}


@pytest.mark.parametrize(("seconds", "seed"), BUDGETS)
def test_damaged_event_files_never_break_the_reader_or_the_report(damaged_logdir, seconds, seed):
    logdir, pristine = damaged_logdir
    rng = random.Random(seed)
    rounds, errors_seen = 0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for path, data in pristine.items():
            if rng.random() < 0.7:
                _damage(rng, path, data)
            else:
                with open(path, "wb") as f:
                    f.write(data)
        runs = read_logdir(str(logdir))
        report = build_report(str(logdir))
        render_text(report)
        render_text(build_report(str(logdir), all_gaps=True), all_gaps=True)
        json.dumps(report)
        errors_seen += sum(bool(run.errors) for run in runs.values())
        rounds += 1
    assert rounds >= 5 and errors_seen > 0  # the damage was seen, and said


def _random_query(rng: random.Random) -> dict[str, str]:
    values = ["", "0", "-1", "1e308", "nan", "inf", "²²", "٣", "10" * 2500, "1" * 5000, "a/b", "../..", "\x00",
              "%", "1.5", "20000", "20001", "9" * 40, "a/rnnmon", "b/rnnmon", "c/rnnmon", "nope/rnnmon", "💥"]
    query = {}
    for name in rng.sample(["run", "start", "end", "points", "experiment", "x"], rng.randint(0, 5)):
        query[name] = rng.choice(values) if rng.random() < 0.8 else rng.randbytes(rng.randint(1, 8)).decode("latin-1")
    return query


@pytest.mark.parametrize(("seconds", "seed"), BUDGETS)
def test_random_queries_on_damaged_runs_never_answer_500(damaged_logdir, seconds, seed):
    from rnnmon_tensorboard.plugin import RnnmonPlugin
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, event_accumulator, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test

    logdir, pristine = damaged_logdir
    rng = random.Random(seed)
    for path, data in pristine.items():
        _damage(rng, path, data)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(size_guidance={event_accumulator.TENSORS: 0})
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    plugin = RnnmonPlugin(base_plugin.TBContext(logdir=str(logdir), data_provider=provider))
    client = werkzeug_test.Client(application.TensorBoardWSGI([plugin]))
    answered = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        route = rng.choice(("runs", "timeline", "summary", "thresholds"))
        query = urllib.parse.urlencode(_random_query(rng))
        response = client.get(f"/data/plugin/rnnmon/{route}?{query}")
        assert response.status_code != 500, (route, query, response.get_data(as_text=True)[:300])
        answered.append(response.status_code)
    assert len(answered) >= 20 and 200 in answered and 400 in answered
