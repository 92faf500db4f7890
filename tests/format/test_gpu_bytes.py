"""GPU data in at most 200 bytes per GPU-second, everything counted (issue 30, item 2), on the runs
`benchmarks/disk_size.py` measures: a short run's fixed costs (each GPU described once per file, metadata JSON
without spaces) and each chunk's (format version 5's short header and raw deflate, a poll's few rows deflated too);
and a run written by version 4's writer reads and reports as the same rows written by today's."""

from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np
from tensorboard.compat.proto import event_pb2

from rnnmon.format import packing, schema, series
from rnnmon.format.eventfile import scan_records
from rnnmon.format.index_located import devices_in
from rnnmon.format.logdir import read_logdir
from rnnmon.format.writer import SummaryWriter
from rnnmon.report import build_report

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from disk_size import figures
from synthetic_run import write_run

T0 = 1_790_000_000.0
VERSION_4 = series.Format(4, series.FORMAT.tables)  # the writer before the short header (b"rnm3" chunks)
DEVICE = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0", "utilization": "nvml"}


def test_a_30_s_gpu_run_writes_its_gpu_data_in_under_180_bytes_a_gpu_second(tmp_path):
    """1,500 steps (30 virtual s, a flush every 2 s) on one fake GPU through the Recorder and Sampler a fit uses:
    utilization, device stats, per-GPU Scalars-tab means and their index came to 197.6 bytes a GPU-second and
    12.6 a step (version 4); 165.0 and 11.7 now. A real fit of that length writes about 13 more a GPU-second
    (docs/performance.md), so this bound keeps it under 200."""
    run_dir = str(tmp_path / "gpu" / "rnnmon")
    written = write_run(run_dir, 1500, "gpu")
    figure = figures(run_dir, 1500, written["virtual_s"], 1)
    assert figure["gpu_bytes_per_gpu_second"] <= 180
    assert figure["bytes_per_step"] <= 12


def _metadata(run_dir: str) -> dict[str, dict]:
    (path,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    found = {}
    for record in scan_records(path).records:
        for value in event_pb2.Event.FromString(record).summary.value:
            if value.HasField("metadata") and value.metadata.plugin_data.plugin_name == schema.PLUGIN_NAME:
                content = value.metadata.plugin_data.content
                assert b", " not in content and b": " not in content  # no spaces between JSON items
                found[value.tag] = json.loads(content)
    return found


def test_a_gpu_is_described_once_and_every_reader_still_names_it(tmp_path):
    run_dir = str(tmp_path / "gpu" / "rnnmon")
    write_run(run_dir, 200, "gpu")
    content = _metadata(run_dir)
    assert content["rnnmon/util/gpu0"]["device"]["name"] and "device" not in content["rnnmon/stats/gpu0"]
    described = content["rnnmon/util/gpu0"]["device"]
    assert read_logdir(str(tmp_path))["gpu/rnnmon"].devices == {0: described}
    (path,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    assert devices_in(path) == {0: described}


def _write(run_dir: str, fmt: series.Format) -> None:
    """The same rows in `fmt`: 20 flushes of 100 steps, a dozen utilization samples, 4 device polls, a gap; the GPU
    described as that version's recorder describes it (version 4: on both its tables)."""
    rng = np.random.default_rng(0)
    writer = SummaryWriter(run_dir, fmt)
    writer.json(schema.RUN_TAG, {"version": fmt.version, "status": "finished", "start": T0, "end": T0 + 40,
                                 "pid": 1, "gpus": [DEVICE], "input_wait": "measured", "nvml": "available"})
    for chunk in range(20):
        t = T0 + 2.0 * chunk
        n = np.arange(100)
        end = t + 0.02 * (n + 1)
        writer.table(schema.STEPS_TAG, np.column_stack([
            100 * chunk + n + 1, np.zeros(100), end - 0.019, end, rng.uniform(1, 3, 100),
            np.where(n + chunk == 0, np.nan, 1.0), np.ones(100)]))
        samples = t + np.arange(12) / 6
        writer.table(f"{schema.UTIL_TAG_PREFIX}0", np.column_stack([samples, np.rint(rng.uniform(0, 99, 12))]),
                     device=DEVICE)
        stats = np.tile(rng.uniform(1, 300, len(schema.STAT_COLUMNS)), (4, 1))
        stats[:, 0] = t + np.arange(4) / 2
        writer.table(f"{schema.STATS_TAG_PREFIX}0", stats, **({"device": DEVICE} if fmt.version < 5 else {}))
        writer.table(schema.GAPS_TAG, np.array([[0, t + 1.0, t + 1.2, 0]]))
        writer.flush()
    writer.close()


def test_a_version_4_run_reads_and_reports_as_the_same_rows_written_in_version_5(tmp_path):
    _write(str(tmp_path / "v4" / "run" / "rnnmon"), VERSION_4)
    _write(str(tmp_path / "v5" / "run" / "rnnmon"), series.FORMAT)
    sizes = {}
    for version, magic in (("v4", packing.PLANES_MAGIC), ("v5", packing.COMPACT_PLANES_MAGIC)):
        (path,) = glob.glob(str(tmp_path / version / "run" / "rnnmon" / "events.out.tfevents.*"))
        with open(path, "rb") as f:
            data = f.read()
        assert magic in data
        sizes[version] = len(data)
    assert sizes["v5"] < sizes["v4"]
    old, new = (read_logdir(str(tmp_path / v))["run/rnnmon"] for v in ("v4", "v5"))
    assert old.errors == new.errors == [] and old.devices == new.devices == {0: DEVICE}
    for table in ("steps", "gaps"):
        np.testing.assert_array_equal(getattr(old, table), getattr(new, table))
    for table in ("util", "stats"):
        np.testing.assert_array_equal(getattr(old, table)[0], getattr(new, table)[0])
    assert build_report(str(tmp_path / "v4")) == build_report(str(tmp_path / "v5"))
