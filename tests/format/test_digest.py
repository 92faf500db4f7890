"""The run digest: a summary read from the digest records beside the index equals the whole read's, exactly for a
small run and within the documented error for a long one; a digest that disagrees with the data is set aside."""

from __future__ import annotations

import glob
import json
import os
import shutil
import struct
import time
import tracemalloc
import zlib

import numpy as np
import pytest

from rnnmon.analysis.digest_figures import device_figures, step_figures
from rnnmon.analysis.summary import summarize
from rnnmon.format import digest, digest_file, index, schema
from rnnmon.format.digest_read import DigestReader, read_run
from rnnmon.format.logdir import read_logdir
from tests.synthetic_runs import LiveRun, write_gpu_run, write_writers

LONG_STEPS = 200_000  # three digest records and a tail
LAYOUT_1 = os.path.join(os.path.dirname(__file__), "fixtures", "digest-layout-1.bin")  # of `_fixture_tables`


def _summaries(logdir: str) -> tuple[dict, dict]:
    """(from the digest, from the whole read) of the one run under `logdir`."""
    (name,) = read_logdir(logdir)
    return summarize(read_logdir(logdir, digest=True)[name]), summarize(read_logdir(logdir)[name])


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("long")
    write_gpu_run(str(logdir / "run" / "rnnmon"), LONG_STEPS // 1000, steps_per_chunk=1000,
                  info={"input_cache": "cache", "fetch_floor_ms": 4.0})
    return str(logdir)


def _records(run_dir: str) -> tuple[str, list[tuple[int, bytes]]]:
    """The digest file of the run's one event file's index, and its records."""
    assert len(glob.glob(os.path.join(run_dir, "rnnmon-index", "*"))) == 1
    return _records_of(run_dir, 0)


def _records_of(run_dir: str, at: int) -> tuple[str, list[tuple[int, bytes]]]:
    """The digest file of the `at`-th event file's index, and its records."""
    folder = sorted(glob.glob(os.path.join(run_dir, "rnnmon-index", "*")))[at]
    with open(os.path.join(folder, digest_file.DIGEST_FILE), "rb") as file:
        data = file.read()
    out, position = [], 0
    while position < len(data):
        through, size, _ = struct.unpack_from("<QII", data, position)
        out.append((through, data[position + 16: position + 16 + size]))
        position += 16 + size
    return os.path.join(folder, digest_file.DIGEST_FILE), out


def _write_records(path: str, records: list[tuple[int, bytes]]) -> None:
    with open(path, "wb") as out:
        for through, payload in records:
            header = struct.pack("<QI", through, len(payload))
            out.write(header + struct.pack("<I", zlib.crc32(payload, zlib.crc32(header))) + payload)


@pytest.mark.parametrize("cache", [None, "cache"])
def test_a_small_run_summarized_from_its_index_equals_the_whole_read_exactly(tmp_path, cache):
    write_gpu_run(str(tmp_path / "run" / "rnnmon"), 40, gpus=2, dip_at=17, profile_at=3.0,
                  info={"input_cache": cache} if cache else None)
    from_digest, whole = _summaries(str(tmp_path))
    assert from_digest == whole
    assert whole["steps"] == 200 and whole["idle_gap_count"] == 80 and len(whole["gpus"]) == 2


def test_a_long_run_is_summarized_from_its_digest_records_within_the_documented_error(long_run):
    run_dir = os.path.join(long_run, "run", "rnnmon")
    _, records = _records(run_dir)
    assert len(records) == LONG_STEPS // digest.RECORD_STEPS  # and the rest is the tail
    data = read_run(run_dir, "run/rnnmon")
    assert data.digest.steps.rows == LONG_STEPS and data.digest.steps.raw is None  # aggregates only
    assert not len(data.steps) and not len(data.gaps) and not data.util and not data.stats  # no table held
    from_digest, whole = _summaries(long_run)
    assert from_digest == whole  # one code path: the digest, from the records or from the rows
    whole_data = read_logdir(long_run)["run/rnnmon"]
    steps, phases = whole_data.steps, whole_data.phases
    kept = steps[~np.isnan(steps[:, 5])]
    per_batch_ms = 1e3 * (kept[:, 3] - kept[:, 2]) / kept[:, 6]
    wait_ms = kept[:, 4]
    for got, values in ((from_digest["step_ms"], per_batch_ms), (from_digest["input_wait_ms"], wait_ms)):
        for key, q in (("median", 50), ("p90", 90)):
            exact = float(np.percentile(values, q))
            assert abs(got[key] - exact) <= digest.RELATIVE_ERROR * exact + 1e-4
    assert from_digest["steps"] == LONG_STEPS and from_digest["epochs"] == LONG_STEPS // 1000 // 10
    evals = phases[phases[:, 0] == schema.PHASE_KINDS.index("eval")]
    assert from_digest["wall_s"] == pytest.approx(float((kept[:, 3] - kept[:, 2]).sum() + kept[:, 5].sum() / 1e3
                                                        + (evals[:, 2] - evals[:, 1]).sum()), abs=2e-3)
    assert from_digest["cache_fill"]["steps"] == 9999  # the first epoch but its warm-up step
    assert 0 < from_digest["shares"]["input"] < 1 and from_digest["gpus"][0]["samples"] == 12 * 200


def _copy(long_run: str, tmp_path) -> str:
    """A copy of the long run's log directory, to damage."""
    copy = str(tmp_path / "copy")
    shutil.copytree(long_run, copy)
    return copy


def _assert_the_data_wins(logdir: str, note: str) -> None:
    """The summary from the digest names the disagreement (`note`) and otherwise equals the whole read."""
    from_digest, whole = _summaries(logdir)
    assert any(note in n for n in from_digest["notes"])
    from_digest["notes"] = [n for n in from_digest["notes"] if "digest" not in n]
    assert from_digest == whole


def test_a_digest_record_that_disagrees_with_the_data_is_set_aside_and_the_data_wins(long_run, tmp_path):
    copy = _copy(long_run, tmp_path)
    run_dir = os.path.join(copy, "run", "rnnmon")
    path, records = _records(run_dir)
    wrong = digest.RunDigest.loads(records[0][1])
    wrong.steps.rows += 5  # a record whose counts the index's chunk directory does not hold, checksums intact
    _write_records(path, [(records[0][0], wrong.dumps()), *records[1:]])
    _assert_the_data_wins(copy, "digest disagrees with the data")


def test_a_digest_record_that_fails_its_checksum_is_set_aside_and_the_data_wins(long_run, tmp_path):
    copy = _copy(long_run, tmp_path)
    path, _ = _records(os.path.join(copy, "run", "rnnmon"))
    with open(path, "r+b") as file:
        file.seek(40)
        byte = file.read(1)
        file.seek(40)
        file.write(bytes([byte[0] ^ 0xFF]))
    _assert_the_data_wins(copy, "checksum fails")


def test_a_listed_document_event_that_is_not_there_is_set_aside_and_the_data_wins(long_run, tmp_path):
    copy = _copy(long_run, tmp_path)
    run_dir = os.path.join(copy, "run", "rnnmon")
    (folder,) = glob.glob(os.path.join(run_dir, "rnnmon-index", "*"))
    path = os.path.join(folder, index.DOCUMENTS)
    entries = np.fromfile(path, dtype=index.DIRECTORY)
    assert len(entries) >= 2  # the run description at its start, the phases and description at its end
    entries["offset"][0] += 3  # checksums intact: the listed event is not where it says
    index.seal(entries).tofile(path)
    _assert_the_data_wins(copy, "no whole event")


def test_a_torn_last_digest_record_is_left_to_the_tail(long_run, tmp_path):
    copy = _copy(long_run, tmp_path)
    path, _ = _records(os.path.join(copy, "run", "rnnmon"))
    os.truncate(path, os.path.getsize(path) - 7)
    from_digest, whole = _summaries(copy)
    assert from_digest == whole and not from_digest["notes"]


@pytest.mark.parametrize("lost", ["digest", "docs", "index"])
def test_a_run_without_digest_records_or_index_still_summarizes(tmp_path, lost):
    run_dir = str(tmp_path / "run" / "rnnmon")
    write_gpu_run(run_dir, 40, profile_at=3.0)
    (folder,) = glob.glob(os.path.join(run_dir, "rnnmon-index", "*"))
    if lost == "index":  # built on the first read, beside the run
        shutil.rmtree(os.path.join(run_dir, "rnnmon-index"))
        assert read_run(run_dir, "run/rnnmon").digest.steps.rows == 200 and os.path.isdir(folder)
    elif lost == "docs":  # an index written before `dir.docs`: the documents are scanned for
        os.remove(os.path.join(folder, index.DOCUMENTS))
    else:
        assert not os.path.exists(os.path.join(folder, digest_file.DIGEST_FILE))  # fewer steps than a record
    from_digest, whole = _summaries(str(tmp_path))
    assert from_digest == whole and whole["steps"] == 200


def test_a_digest_survives_its_bytes_and_merges_in_order():
    rows = np.array([(s + 1, s // 50, 10.0 + 0.02 * s, 10.0 + 0.02 * s + 0.018, 5.0 + s % 3,
                      np.nan if s in (0, 120) else 2.0, 1) for s in range(200)])
    whole = digest.RunDigest.of(rows, np.empty((0, 4)), {}, {})
    parts = digest.RunDigest.loads(digest.RunDigest.of(rows[:70], np.empty((0, 4)), {}, {}).dumps())
    second = digest.RunDigest()
    second.steps.fit_epoch = parts.steps.fit_epoch
    second.add(schema.STEPS_TAG, rows[70:])
    parts.merge(digest.RunDigest.loads(second.dumps()))
    figures = step_figures(parts.steps, np.nan, "cache", np.empty((0, 3)), [])
    exact = step_figures(whole.steps, np.nan, "cache", np.empty((0, 3)), [])
    assert parts.steps.raw is None and whole.steps.raw is not None
    for key in ("steps", "epochs", "kept", "measured"):
        assert figures[key] == exact[key]
    for key in ("duration_s", "gap_s", "wait_s", "beyond_floor_s"):
        assert figures[key] == pytest.approx(exact[key], rel=1e-12)
    assert figures["cache_fill"]["steps"] == exact["cache_fill"]["steps"]
    assert figures["time_s"]["fit"] == pytest.approx(exact["time_s"]["fit"], abs=1e-4)


def test_writers_whose_files_overlap_are_read_whole_and_summarized_as_before(tmp_path):
    write_writers(str(tmp_path / "run" / "rnnmon"), 2, 60, 10)  # two processes in one folder, chunks interleaved
    assert read_run(str(tmp_path / "run" / "rnnmon"), "run/rnnmon") is None
    from_digest, whole = _summaries(str(tmp_path))
    assert from_digest == whole and whole["steps"] == 120


@pytest.mark.parametrize("header", [
    b"[" * 100_000 + b"]" * 100_000,  # a JSON header nested 100,000 deep: RecursionError
    b'[["steps.rows", [1e999]]]',  # a shape of 1e999: OverflowError
], ids=["deep", "overflow"])
def test_a_checksummed_digest_record_that_is_no_digest_reads_the_run_whole(long_run, tmp_path, header):
    """Such records used to end `rnnmon report` with a traceback and no run, and answer `/summary` with a 500."""
    copy = _copy(long_run, tmp_path)
    path, records = _records(os.path.join(copy, "run", "rnnmon"))
    _write_records(path, [(records[0][0], header + b"\n" + zlib.compress(b"")), *records[1:]])
    _assert_the_data_wins(copy, "is not one: not a digest")


def test_a_digest_record_inflating_past_its_cap_is_refused_without_inflating_it():
    """A 3.1 MB record that inflates to 3 GiB cost the report 3 GB; a record's arrays are ~70 KB (214 KB for 8 GPUs):
    inflation stops at 16 MiB. Here a 256 MiB bomb."""
    bomb = b'[["steps.rows", [1]]]\n' + zlib.compress(bytes(256 << 20), 1)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="not a digest"):
            digest.RunDigest.loads(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20  # the cap, 16 MiB, and its copy: never the 256 MiB


def test_a_sampled_wait_is_judged_on_the_timed_steps_alike_from_rows_and_from_a_digest():
    # steps_per_execution=8, one execution in 16 timed (NaN elsewhere): 80 ms of 8 batches, 60 ms of it waiting;
    # the timed executions run 10 ms slower (pulled in Python), their wait does not grow.
    timed = np.arange(400) % 16 == 1
    begin = 10.0 + 0.2 * np.arange(400)
    rows = np.column_stack([8 * (np.arange(400) + 1), np.zeros(400), begin, begin + np.where(timed, 0.09, 0.08),
                            np.where(timed, 60.0, np.nan), np.r_[np.nan, np.full(399, 1.0)], np.full(400, 8)])
    exact = step_figures(digest.RunDigest.of(rows, np.empty((0, 4)), {}, {}).steps, 0.0, None, np.empty((0, 3)), [])
    parts = digest.RunDigest.loads(digest.RunDigest.of(rows, np.empty((0, 4)), {}, {}).dumps())
    approximate = step_figures(parts.steps, 0.0, None, np.empty((0, 3)), [])
    whole_s = float((rows[1:, 3] - rows[1:, 2]).sum() + 399e-3)
    for figures in (exact, approximate):
        assert figures["coverage"] == round(25 / 399, 4)  # 25 timed of the 399 after the warm-up
        assert figures["input_wait_ms"]["median"] == pytest.approx(7.5, rel=digest.RELATIVE_ERROR)
        assert figures["input_share"] == pytest.approx(0.060 * 399 / whole_s, abs=2e-3)  # not 25/399 of it
        assert figures["wait_s"] == pytest.approx(0.060 * 399) and figures["beyond_floor_s"] == pytest.approx(23.94)


def _fixture_tables() -> tuple[np.ndarray, np.ndarray, dict, dict]:
    """Two fits of 300 steps, 6 gaps, two GPUs' samples: the tables `LAYOUT_1` digests (written by the digest of
    December 2026, which stored some fields by position)."""
    s = np.arange(300)
    begin = 100.0 + 0.05 * s
    steps = np.column_stack([s + 1, s // 100, begin, begin + 0.03 + 0.001 * (s % 7), 2.0 + (s % 11),
                             np.where(s % 150 == 0, np.nan, 1.5), np.ones(300)])
    gaps = np.array([(0, 101.0 + i, 101.2 + 1.1 * i, i % 3) for i in range(6)], dtype=np.float64)
    util, stats = {}, {}
    for device in (0, 1):
        t = 100.0 + 0.5 * np.arange(40)
        util[device] = np.column_stack([t, (np.arange(40) * 7 + 13 * device) % 101])
        table = np.full((40, 13), np.nan)
        table[:, 0], table[:, 1], table[:, 2], table[:, 3], table[:, 9] = (
            t, 1000.0 + 10 * np.arange(40) + device, 16000.0, 150.0 + np.arange(40) % 5, 40.0 + device)
        stats[device] = table
    return steps, gaps, util, stats


def _figures(read: digest.RunDigest) -> dict:
    return {"steps": step_figures(read.steps, 1.0, "cache", np.empty((0, 3)), []),
            "gpus": [device_figures(read.devices[i], 5.0) for i in sorted(read.devices)],
            "gaps": [read.gaps.rows, read.gaps.groups.tolist(), read.gaps.histogram.tolist(),
                     read.gaps.longest.tolist()]}


def _rewritten(payload: bytes, drop: tuple[str, ...] = (), add: dict | None = None) -> bytes:
    """A record's payload without the arrays named in `drop` and with those in `add`: a record written before those
    fields existed, or after new ones did."""
    header, _, packed = payload.partition(b"\n")
    body, at, arrays = np.frombuffer(zlib.decompress(packed), dtype="<f8"), 0, {}
    for name, shape in json.loads(header):
        size = int(np.prod(shape))
        arrays[name], at = body[at:at + size].reshape(shape), at + size
    assert set(drop) <= set(arrays), f"no fields {set(drop) - set(arrays)} to drop"
    arrays = {name: value for name, value in arrays.items() if name not in drop} | (add or {})
    return (json.dumps([[name, list(np.shape(value))] for name, value in arrays.items()]).encode() + b"\n"
            + zlib.compress(b"".join(np.asarray(v, dtype="<f8").tobytes() for v in arrays.values())))


def test_a_digest_written_by_the_december_2026_layout_reads_by_name_as_the_same_figures():
    with open(LAYOUT_1, "rb") as file:
        old = digest.RunDigest.loads(file.read())
    today = digest.RunDigest.loads(digest.RunDigest.of(*_fixture_tables()).dumps())
    assert _figures(old) == _figures(today)
    assert _figures(old)["gpus"][1]["power_mean_w"] == 152.0 and old.steps.rows == 300


def test_a_digest_written_before_a_column_was_added_reads_it_as_not_recorded_and_the_rest_alike():
    """A stats column added to the digest (the NVML recipe) made every older record read as damaged ("a digest field
    has shape (8,), expected (10,)"): fields are stored and read by name, a missing one reads as not recorded, an
    unknown one (a newer writer's) is left out."""
    payload = digest.RunDigest.of(*_fixture_tables()).dumps()
    older = digest.RunDigest.loads(_rewritten(payload, drop=(
        "gpu0.stats.power_w.sum", "gpu0.stats.power_w.count", "steps.top.input_wait_ms")))
    newer = digest.RunDigest.loads(_rewritten(payload, add={
        "gpu0.stats.encoder_util_pct.sum": np.float64(4.0), "gpu0.stats.encoder_util_pct.count": np.float64(2.0),
        "steps.top.a_new_column": np.zeros(256)}))
    today = _figures(digest.RunDigest.loads(payload))
    assert _figures(newer) == today
    figures = _figures(older)
    assert figures["gpus"][0]["power_mean_w"] is None and today["gpus"][0]["power_mean_w"] == 152.0
    assert np.isnan(older.steps.top[:, 4]).all() and older.steps.top.shape == (256, 7)
    figures["gpus"][0]["power_mean_w"] = today["gpus"][0]["power_mean_w"]
    assert figures["gpus"] == today["gpus"] and figures["gaps"] == today["gaps"]


def test_a_kept_digest_reader_reads_a_growing_run_as_a_fresh_read_does(tmp_path):
    """The tab keeps one reader per run and merges only what is new: across digest records landing, a second event
    file and a digest found damaged, each read summarizes as a fresh read of the files as they are."""
    run_dir = str(tmp_path / "live" / "rnnmon")
    live, kept = LiveRun(run_dir), DigestReader(run_dir, "live/rnnmon")
    for chunk in range(30):
        live.chunk(5000)
        if chunk in (0, 12, 13, 14, 26, 29):  # records at the first event after 65,536 and 131,072 steps
            assert summarize(kept.read()) == summarize(read_run(run_dir, "live/rnnmon"))
    live.close()
    (first,) = glob.glob(os.path.join(run_dir, "*tfevents*"))
    while int(time.time()) <= int(os.path.basename(first).split(".")[3]):
        time.sleep(0.05)  # a name of a later second: files are read in name order (a counter at 10 sorts before 9)
    second = LiveRun(run_dir, start=live.t + 60)  # a second event file after the first
    second.chunk(3000)
    data = kept.read()
    assert data.digest.steps.rows == 153_000 and summarize(data) == summarize(read_run(run_dir, "live/rnnmon"))
    path, _ = _records_of(run_dir, 0)
    os.truncate(path, os.path.getsize(path) - 100)  # cut below what the kept reader read: it notes it, reads whole
    second.chunk(1000)
    whole = kept.read()
    assert whole.digest is None and "its digest was cut below byte" in whole.notes[-1]
    again = kept.read()  # afresh: the torn record dropped, its events read as tail
    assert again.digest.steps.rows == 154_000 and summarize(again) == summarize(read_run(run_dir, "live/rnnmon"))
    second.close()
