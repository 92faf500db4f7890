"""Format version 4's byte planes (b"rnm3") and 256-step pyramid records, and version 5's short header and raw deflate
(b"rnm4", b"rnm5"): smaller chunks and index, the same rows, and runs of version 3 (b"rnm2" chunks, 64-step records)
still read and report as they did."""

from __future__ import annotations

import glob
import os
import shutil
import tarfile
import zlib

import numpy as np
import pytest
from rnnmon_tensorboard.indexed_timeline import IndexedTimeline

from rnnmon.format import index, packing, schema, series
from rnnmon.format.logdir import read_logdir
from rnnmon.format.writer import SummaryWriter
from rnnmon.report import build_report

T0 = 1_790_000_000.0
VERSION_3 = series.Format(3, series.FORMAT.tables)  # the writer before byte planes
VERSION_4 = series.Format(4, series.FORMAT.tables)  # the writer before the short header (b"rnm3")
# 1,080 steps and gaps in 270 chunks of 4, by the version-3 writer (December 2026, before byte planes): b"rnm2" chunks,
# its index with 64-step records, a Scalars-tab mean per flush; step 778 waited 30 ms, the others 9.5-14
FORMAT_3_RUN = os.path.join(os.path.dirname(__file__), "fixtures", "format-3-run.tar.gz")


def _steady_steps(n: int, seed: int = 0) -> np.ndarray:
    """An input-bound chunk as `benchmarks/synthetic_run.py` writes it: 20 ms steps, 9.5-14 ms waits."""
    rng = np.random.default_rng(seed)
    host, wait = rng.uniform(3e-5, 8e-5, n), rng.uniform(9.5, 14.0, n)
    end = T0 + 0.02 * np.arange(1, n + 1)
    return np.column_stack([np.arange(1, n + 1), np.zeros(n), end - 0.02 + host, end, wait, host * 1e3, np.ones(n)])


def _chunks(n: int = 100) -> dict[str, np.ndarray]:
    steps = _steady_steps(n)
    rng = np.random.default_rng(1)
    samples = T0 + np.arange(n) / 6 + rng.uniform(0, 1e-3, n)
    return {schema.STEPS_TAG: steps,
            schema.GAPS_TAG: np.column_stack([-np.ones(n), steps[:, 2] - steps[:, 4] / 1e3, steps[:, 2],
                                              np.zeros(n)]),
            f"{schema.UTIL_TAG_PREFIX}0": np.column_stack([samples, np.rint(rng.uniform(60, 95, n))]),
            schema.HOST_TAG: np.column_stack([samples[::-1], rng.uniform(0, 200, n).astype(np.float32)])}


def test_a_steady_chunk_packs_into_fewer_bytes_as_byte_planes():
    """100 steps (one 2 s flush): 7.6 bytes a step row by row, 5.5 as planes; 100 gaps 7.1 and 4.6."""
    chunks = _chunks()
    assert len(packing.encode(schema.STEPS_TAG, chunks[schema.STEPS_TAG])) < 6.0 * 100
    assert len(packing.encode(schema.GAPS_TAG, chunks[schema.GAPS_TAG])) < 5.0 * 100


@pytest.mark.parametrize("tag", list(_chunks()))
def test_planes_and_rows_decode_to_the_same_table(tag):
    rows = _chunks()[tag]
    v5, v4, by_row = (packing.encode(tag, rows), packing.encode(tag, rows, compact=False),
                      packing.encode(tag, rows, planes=False))
    assert v5[:4] == packing.COMPACT_PLANES_MAGIC and v4[:4] == packing.PLANES_MAGIC and by_row[:4] == packing.MAGIC
    assert len(v5) < len(v4) < len(by_row)
    for blob in (v5, v4):
        np.testing.assert_array_equal(packing.decode(tag, blob), packing.decode(tag, by_row))
    _, counts, errors = packing.decode_many(tag, [by_row, v4, v5])  # one tag may hold all three
    assert errors == [] and counts == [(0, len(rows)), (1, len(rows)), (2, len(rows))]


def test_a_polls_few_rows_stay_row_by_row_where_that_is_smaller():
    rows = _chunks()[schema.HOST_TAG][:2]
    assert packing.encode(schema.HOST_TAG, rows)[:4] == packing.COMPACT_MAGIC
    assert packing.encode(schema.HOST_TAG, rows, compact=False)[:4] == packing.MAGIC


@pytest.mark.parametrize(("compact", "head", "wbits"), [(False, 24, 15), (True, 17, -15)])
def test_planes_whose_time_differences_leave_int32_are_refused(compact, head, wbits):
    rows = _chunks()[f"{schema.UTIL_TAG_PREFIX}0"][:40]
    blob = packing.encode(f"{schema.UTIL_TAG_PREFIX}0", rows, planes=True, compact=compact)
    assert blob[:4] in packing.MAGICS[1::2] and blob[4] == 3 | 0x80  # planes, layout 3, compressed
    body = bytearray(zlib.decompress(blob[head:], wbits))
    body[4 * 40 - 2:4 * 40] = b"\x7f\x7f"  # the last two rows' differences' high bytes: each near 2^31 now
    with pytest.raises(packing.FormatError, match="beyond int32"):
        packing.decode(f"{schema.UTIL_TAG_PREFIX}0", blob[:4] + bytes([3]) + blob[5:head] + bytes(body))


def _write(run_dir: str, fmt: series.Format) -> None:
    writer = SummaryWriter(run_dir, fmt)
    writer.json(schema.RUN_TAG, {"version": fmt.version, "status": "finished", "start": T0, "end": T0 + 100,
                                 "pid": 1, "gpus": [], "input_wait": "measured"})
    chunks = _chunks(400)
    for part in range(4):
        for tag in (schema.STEPS_TAG, schema.GAPS_TAG, schema.HOST_TAG):
            writer.table(tag, chunks[tag][part * 100:(part + 1) * 100])
        writer.flush()
    writer.close()


@pytest.mark.parametrize("today", ["v4", "v5"])
def test_a_version_3_run_reads_and_reports_as_the_same_run_written_in_a_later_version(tmp_path, today):
    """The real writer, given version 3's format, writes b"rnm2" chunks; today's reader reads them, and the report
    on them is the report on version 4's (b"rnm3") or 5's (b"rnm5") file of the same rows."""
    _write(str(tmp_path / "v3" / "run" / "rnnmon"), VERSION_3)
    _write(str(tmp_path / "v4" / "run" / "rnnmon"),
           VERSION_4 if today == "v4" else series.FORMAT)
    sizes = {}
    for version in ("v3", "v4"):
        (path,) = glob.glob(str(tmp_path / version / "run" / "rnnmon" / "events.out.tfevents.*"))
        with open(path, "rb") as f:
            data = f.read()
        sizes[version] = len(data)
        magic = {"v3": packing.MAGIC, "v4": packing.PLANES_MAGIC, "v5": packing.COMPACT_PLANES_MAGIC}
        assert magic[version if version == "v3" else today] in data
    assert sizes["v4"] < 0.8 * sizes["v3"]
    old, new = (read_logdir(str(tmp_path / v))["run/rnnmon"] for v in ("v3", "v4"))
    assert old.errors == new.errors == [] and old.notes == new.notes == []
    for table in ("steps", "gaps"):
        np.testing.assert_array_equal(getattr(old, table), getattr(new, table))
    reports = [build_report(str(tmp_path / v)) for v in ("v3", "v4")]
    assert reports[0] == reports[1]
    shutil.rmtree(tmp_path / "v4" / "run" / "rnnmon" / "rnnmon-index")  # a reader that builds it reads the same
    assert build_report(str(tmp_path / "v4")) == reports[1]


def test_a_version_3_runs_own_index_draws_it_and_a_rebuilt_one_reports_the_same(tmp_path):
    with tarfile.open(FORMAT_3_RUN) as archive:
        archive.extractall(tmp_path / "old" / "run", filter="data")
    run_dir = str(tmp_path / "old" / "run" / "rnnmon")
    run = read_logdir(str(tmp_path / "old"))["run/rnnmon"]
    assert run.errors == [] and len(run.steps) == 1080
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    record = index.point_dtype(3).itemsize
    assert os.path.getsize(os.path.join(folder, "steps.L0")) == 1079 // 64 * record
    timeline = IndexedTimeline("r", run_dir)
    timeline.refresh()
    steps = timeline.view(None, None, 1280)["steps"]  # 270 chunks: drawn from the old 64-step records
    assert steps["downsampled"] and steps["total"] == 1079 and timeline.notes == []
    assert steps["input_wait_ms"][steps["step"].index(778)] == pytest.approx(30.0)
    report = build_report(str(tmp_path / "old"))
    shutil.rmtree(os.path.join(run_dir, index.INDEX_DIR))  # today's reader builds its own: 256-step records
    assert build_report(str(tmp_path / "old")) == report
    assert os.path.getsize(os.path.join(folder, "steps.L0")) == 1079 // index.STEPS_BLOCK * record
