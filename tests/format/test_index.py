"""The reading index (rnnmon.format.index) written by the real writer, read back, and distrusted where the data
disagrees; /timeline drawn from it (rnnmon_tensorboard.indexed_timeline) against the whole-run timeline."""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import time

import numpy as np
import pytest
from conftest import bytes_read, mounted_tmpfs
from rnnmon_tensorboard.indexed_timeline import IndexedTimeline
from rnnmon_tensorboard.timeline import TimelineIndex

from rnnmon.format import digest_file, index, schema
from rnnmon.format.index_read import SCAN_BYTES
from rnnmon.format.reader import RunReader
from rnnmon.format.writer import SummaryWriter
from tests.synthetic_runs import LiveRun, write_gpu_run

CHUNKS, PER_CHUNK = 300, 60  # 18,000 steps in 300 chunks: past the chunks a window reads raw, so the pyramid draws


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("index") / "long" / "rnnmon")
    write_gpu_run(run_dir, CHUNKS, steps_per_chunk=PER_CHUNK, dip_at=777)
    return run_dir


def _copy(written: str, tmp_path) -> str:
    run_dir = str(tmp_path / "copy" / "rnnmon")
    shutil.copytree(written, run_dir)
    return run_dir


def _whole(run_dir: str, start=None, end=None, points=1280) -> dict:
    return TimelineIndex(RunReader("r").update_from_files(run_dir)).view(start, end, points)


def _indexed(run_dir: str) -> IndexedTimeline:
    timeline = IndexedTimeline("r", run_dir)
    timeline.refresh()
    return timeline


def _rows(run_dir: str) -> dict[int, tuple[float, float, float]]:
    """Every drawn step: number -> (input wait, compute, host gap) as the index stores them (float32)."""
    steps = RunReader("r").update_from_files(run_dir).steps
    ((_, (_, key, values)),) = index.series_of(schema.STEPS_TAG, steps)
    return {int(k): tuple(v) for k, v in zip(key, values.tolist())}


def test_the_writer_writes_an_index_beside_each_event_file_that_tensorboard_does_not_load(written):
    folder = index.index_folder(glob.glob(os.path.join(written, "*tfevents*"))[0])
    names = sorted(os.listdir(folder))
    assert {"dir.steps", "steps.L0", "steps.L1", "util0.L0", "sm0.L0", "gaps.d0.c0.L0"} <= set(names)
    assert not any(index.EVENT_FILE_MARK in name for root, _, files in os.walk(written) for name in files
                   if root != written)
    steps = np.fromfile(os.path.join(folder, "steps.L0"), dtype=index.point_dtype(3))
    assert len(steps) == (CHUNKS * PER_CHUNK - 1) // index.STEPS_BLOCK and index.intact(steps)


@pytest.mark.parametrize("dtype", [index.INTERVALS, index.DIRECTORY, index.point_dtype(3)], ids=["40", "44", "192"])
def test_many_records_are_checked_at_once_as_one_by_one_and_a_flipped_bit_fails_them(dtype):
    """`intact` checks a long array (a whole-run view of gaps reads 14k level-0 records) byte column by byte column
    of all records at once: it must agree with each record's own zlib.crc32, one flipped bit anywhere fails it."""
    rng = np.random.default_rng(5)
    count = 30 * dtype.itemsize  # past the size where all are checked at once
    records = np.frombuffer(rng.bytes(count * dtype.itemsize), dtype=dtype).copy()
    index.seal(records)
    assert index.intact(records) and all(index.intact(records[i:i + 1]) for i in (0, count // 2, count - 1))
    for at in (0, 3 * dtype.itemsize + 1, count * dtype.itemsize - 5, count * dtype.itemsize - 1):
        flipped = records.copy()
        flipped.view(np.uint8)[at] ^= 0x10
        record = at // dtype.itemsize
        assert not index.intact(flipped) and not index.intact(flipped[record:record + 1])


def test_a_long_window_is_drawn_from_the_pyramid_with_every_extreme(written):
    whole, drawn = _whole(written), _indexed(written).view(None, None, 1280)
    assert drawn["origin"] == whole["origin"] and drawn["extent"] == whole["extent"]
    assert drawn["gpus"][0]["name"] == whole["gpus"][0]["name"] == "Fake GPU <0>"
    steps = drawn["steps"]
    assert steps["downsampled"] and steps["total"] == whole["steps"]["total"] == CHUNKS * PER_CHUNK - 1
    real = _rows(written)
    for number, wait, compute, gap in zip(steps["step"], steps["input_wait_ms"], steps["compute_ms"],
                                          steps["host_gap_ms"]):
        assert real[number] == pytest.approx((wait, compute, gap), abs=1e-3)  # real rows, never averaged
    for column in ("input_wait_ms", "compute_ms", "host_gap_ms"):
        assert min(steps[column]) == min(whole["steps"][column]) and max(steps[column]) == max(whole["steps"][column])
    util = drawn["gpus"][0]["util"]
    assert 0.0 in util["value"] and util["total"] >= len(util["value"])  # the one-sample dip survives
    assert drawn["gaps"]["total"] == whole["gaps"]["total"]


def test_a_short_window_is_read_from_its_chunks_exactly(written):
    drawn = _indexed(written).view(30.0, 34.0, 1280)
    whole = _whole(written, 30.0, 34.0)
    for part in ("steps", "gaps", "phases"):
        assert drawn[part] == whole[part]
    assert drawn["gpus"][0]["util"] == whole["gpus"][0]["util"]


def test_a_run_without_an_index_gets_one_built_on_first_read(written, tmp_path):
    run_dir = _copy(written, tmp_path)
    shutil.rmtree(os.path.join(run_dir, index.INDEX_DIR))  # as a run of format 1 or 2 has none
    timeline = _indexed(run_dir)
    assert os.path.isdir(os.path.join(run_dir, index.INDEX_DIR)) and not timeline.notes  # built, and kept
    assert timeline.view(None, None, 1280) == _indexed(written).view(None, None, 1280) | {"notes": []}
    assert timeline.view(30.0, 34.0, 1280)["steps"] == _whole(run_dir, 30.0, 34.0)["steps"]


def test_an_index_naming_more_than_the_event_file_holds_is_set_aside_and_noted(written, tmp_path):
    run_dir = _copy(written, tmp_path)
    _cut_at_a_record(run_dir)  # the event file lost its end; the index still names it
    timeline = _indexed(run_dir)
    assert len(timeline.notes) == 1 and "disagrees with the data" in timeline.notes[0]
    drawn, whole = timeline.view(None, None, 1280), _whole(run_dir)
    assert drawn["steps"]["total"] == whole["steps"]["total"] < CHUNKS * PER_CHUNK - 1  # the data wins


def _cut_at_a_record(run_dir: str) -> None:
    """Cut the run's event file at the record that holds its 75th steps chunk: whole records are left."""
    (path,) = glob.glob(os.path.join(run_dir, "*tfevents*"))
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    os.truncate(path, int(np.fromfile(os.path.join(folder, "dir.steps"), dtype=index.DIRECTORY)[75]["offset"]))


def test_an_event_file_cut_inside_a_record_is_truncated_after_the_grace_time(written, tmp_path):
    run_dir = _copy(written, tmp_path)
    (path,) = glob.glob(os.path.join(run_dir, "*tfevents*"))
    os.truncate(path, os.path.getsize(path) - 5)
    timeline = _indexed(run_dir)
    assert not timeline.errors  # a live writer's half-written record, for all it knows
    then = time.time() - 60
    os.utime(path, (then, then))
    timeline = _indexed(run_dir)
    assert len(timeline.errors) == 1 and "truncated" in timeline.errors[0]


def test_an_index_record_that_fails_its_checksum_is_set_aside_and_noted(written, tmp_path):
    run_dir = _copy(written, tmp_path)
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    path = os.path.join(folder, "steps.L0")
    with open(path, "r+b") as f:  # a record in the middle: found only when read
        f.seek(index.point_dtype(3).itemsize * 3 + 20)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    timeline = _indexed(run_dir)
    drawn = timeline.view(None, None, 1280)
    assert any("checksum" in note for note in timeline.notes)
    assert drawn["steps"] == _indexed(written).view(None, None, 1280)["steps"]


def test_an_event_that_is_not_where_the_index_says_is_set_aside_and_noted(written, tmp_path):
    run_dir = _copy(written, tmp_path)
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    path = os.path.join(folder, "dir.steps")
    entries = np.fromfile(path, dtype=index.DIRECTORY)
    entries[40]["offset"] += 8  # a chunk in a window the tab reads raw
    index.seal(entries).tofile(path)
    timeline = _indexed(run_dir)
    start = float(entries[40]["t_first"]) - timeline.index.extent()[0]
    drawn = timeline.view(start, start + 1.0, 1280)
    assert any("disagrees with the data" in note for note in timeline.notes)
    assert drawn["steps"] == _whole(run_dir, start, start + 1.0)["steps"]


def test_a_rest_chunk_not_where_the_index_says_is_found_when_a_view_first_draws_from_the_pyramid(written, tmp_path):
    """The rows after a series' last level-0 record are read when a view first draws from its pyramid, no longer
    at open: a chunk there that is not where the index says still sets the index aside, and the view is drawn
    from the data."""
    run_dir = _copy(written, tmp_path)
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    path = os.path.join(folder, "dir.steps")
    entries = np.fromfile(path, dtype=index.DIRECTORY)
    last_record = np.fromfile(os.path.join(folder, "steps.L0"), dtype=index.point_dtype(3))[-1]
    rest = np.flatnonzero(entries["t_last"] > last_record["t_last"])
    assert len(rest) >= 2  # the last chunk is checked at open: one before it
    entries[rest[-2]]["offset"] += 8
    index.seal(entries).tofile(path)
    timeline = _indexed(run_dir)
    assert not timeline.notes  # not read yet
    drawn = timeline.view(None, None, 1280)
    assert any("disagrees with the data" in note for note in timeline.notes)
    assert drawn["steps"] == _indexed(written).view(None, None, 1280)["steps"]


def test_a_torn_index_tail_is_dropped_without_a_note(written, tmp_path):
    run_dir = _copy(written, tmp_path)
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    for name in ("steps.L0", "dir.steps"):
        with open(os.path.join(folder, name), "ab") as f:
            f.write(b"\x07" * 20)  # part of a record: a writer stopped mid-write
    timeline = _indexed(run_dir)
    assert timeline.view(None, None, 1280) == _indexed(written).view(None, None, 1280)
    assert not timeline.notes and not timeline.errors


def test_a_live_run_is_drawn_from_its_index_and_the_bytes_written_since(tmp_path):
    run_dir = str(tmp_path / "live" / "rnnmon")
    writer = SummaryWriter(run_dir)
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": 1000.0})

    def chunk(first: int, rows: int) -> None:
        writer.table(schema.STEPS_TAG, [(s, 0, 1000.0 + 0.02 * s, 1000.0 + 0.02 * s + 0.015, 3.0,
                                         np.nan if s == 1 else 5.0, 1) for s in range(first, first + rows)])
        writer.flush()

    chunk(1, 100)
    timeline = _indexed(run_dir)
    assert timeline.view(None, None, 1280)["steps"]["total"] == 99
    chunk(101, 30)
    timeline.refresh()
    assert timeline.view(None, None, 1280)["steps"]["step"][-1] == 130
    writer.close()


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB tmpfs (root only)."""
    with mounted_tmpfs(tmp_path / "disk", "256k") as mount:
        yield mount


def test_a_full_disk_leaves_whole_index_records_and_the_data_wins(small_disk, caplog):
    run_dir = str(small_disk / "full" / "rnnmon")
    writer = SummaryWriter(run_dir)
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": 1000.0})
    step, refused = 1, 0
    while refused < 3:  # until the disk refused the events, or the index, a few times
        writer.table(schema.STEPS_TAG, [(s, 0, 1000.0 + 0.02 * s, 1000.0 + 0.02 * s + 0.015, 3.0 + s % 7,
                                         np.nan if s == 1 else 5.0, 1) for s in range(step, step + 1000)])
        step += 1000
        written = writer.flush()
        refused += not written or any("reading index" in r.getMessage() for r in caplog.records)
    writer.close()
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    for name in os.listdir(folder):
        if name == digest_file.DIGEST_FILE:  # whole framed records (rnnmon.format.digest_file), none torn
            digest_file.read_records(folder, os.path.getsize(glob.glob(os.path.join(run_dir, "*tfevents*"))[0]))
            continue
        records = np.fromfile(os.path.join(folder, name), dtype=index.dtype_of(name))
        assert os.path.getsize(os.path.join(folder, name)) == records.nbytes and index.intact(records)
    drawn = _indexed(run_dir).view(None, None, 1280)["steps"]
    assert drawn["total"] == _whole(run_dir)["steps"]["total"] > 0


def test_an_index_file_that_cannot_be_written_stops_the_index_and_the_rest_is_read_from_the_events(tmp_path, caplog):
    run_dir = str(tmp_path / "blocked" / "rnnmon")
    writer = SummaryWriter(run_dir)
    (path,) = glob.glob(os.path.join(run_dir, "*tfevents*"))
    os.makedirs(os.path.join(index.index_folder(path), "steps.L0"))  # a folder where the index's file belongs
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": 1000.0})
    for first in range(1, 1001, 100):
        writer.table(schema.STEPS_TAG, [(s, 0, 1000.0 + 0.02 * s, 1000.0 + 0.02 * s + 0.015, 3.0 + s % 7,
                                         np.nan if s == 1 else 5.0, 1) for s in range(first, first + 100)])
        assert writer.flush()  # the events are written; only the index stops
    writer.close()
    stopped = [r.getMessage() for r in caplog.records if "reading index" in r.getMessage()]
    assert len(stopped) == 1 and "cannot write it" in stopped[0]
    timeline = _indexed(run_dir)
    assert timeline.view(None, None, 1280)["steps"] == _whole(run_dir)["steps"]
    assert timeline.view(None, None, 1280)["steps"]["total"] == 999 and not timeline.notes


def test_a_fifo_and_strangers_in_the_index_folder_are_never_opened(written, tmp_path):
    run_dir = _copy(written, tmp_path)
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    os.mkfifo(os.path.join(folder, "steps.L5"))  # opened blocking, this would hang the reader
    os.symlink("/dev/zero", os.path.join(folder, "util0.L3"))
    with open(os.path.join(folder, "notes.txt"), "w") as f:
        f.write("not an index file\n" * 30)  # long enough for records, were it read as one
    timeline = _indexed(run_dir)
    assert timeline.view(None, None, 1280) == _indexed(written).view(None, None, 1280)
    assert not timeline.notes and not timeline.errors


@pytest.mark.parametrize("columns", ["newer", "older"])
def test_an_index_of_a_writer_with_other_columns_maps_them_by_name(tmp_path, columns):
    """A newer writer (a statistic more: a longer packed row) and an older one (before the GPM columns) are indexed
    and drawn by column name, by the writer and by a reader that builds the index in memory, as the whole read
    maps them: SM activity where the file has it, none where it does not, and no error."""
    from rnnmon.format import series

    fmt = (series.FORMAT.with_series(series.STATS_PREFIX, series.Series("fan_speed_pct", "%", "u1", "fan"))
           if columns == "newer" else series.FORMAT)
    if columns == "older":
        stats = series.STATS
        older = dataclasses.replace(stats, series=tuple(s for s in stats.series if not s.source.startswith("GPM")))
        fmt = series.Format(2, tuple(older if t is stats else t for t in series.FORMAT.tables))
    names = fmt.table(f"{schema.STATS_TAG_PREFIX}0").columns
    run_dir = str(tmp_path / "run" / "rnnmon")
    writer = SummaryWriter(run_dir, fmt)
    for chunk in range(40):
        t = 1_790_000_000.0 + chunk * 2 + np.arange(8) * 0.25
        rows = np.zeros((8, len(names)))
        rows[:, 0] = t
        if "sm_activity_pct" in names:
            rows[:, names.index("sm_activity_pct")] = (chunk * 8 + np.arange(8)) % 100
        writer.table(f"{schema.STATS_TAG_PREFIX}0", rows, device={"index": 0, "name": "H200"})
        writer.table(f"{schema.UTIL_TAG_PREFIX}0", np.column_stack([t, np.full(8, 50.0)]))
        writer.flush()
    writer.close()
    in_memory = _copy(run_dir, tmp_path)
    shutil.rmtree(os.path.join(in_memory, index.INDEX_DIR))
    for folder in (run_dir, in_memory):
        timeline = _indexed(folder)
        assert timeline.errors == [] and timeline.notes == []
        for start, end in ((None, None), (10.0, 12.0)):
            drawn, whole = timeline.view(start, end, 1280)["gpus"][0], _whole(run_dir, start, end)["gpus"][0]
            assert drawn["util"]["value"] and set(drawn["util"]["value"]) == {50.0}
            if columns == "newer":
                assert max(drawn["sm_activity"]["value"]) == max(whole["sm_activity"]["value"]) >= 49
            else:
                assert drawn.get("sm_activity") is None and whole.get("sm_activity") is None


def _truncate_records(path: str, count: int) -> None:
    os.truncate(path, count * index.dtype_of(os.path.basename(path)).itemsize)


@pytest.mark.parametrize("lost", ["dir.steps", "dir.gaps.d0.c0", "lagging steps", "lagging dir.steps"])
def test_a_lost_or_lagging_index_file_is_drawn_from_the_event_file_beyond_it(written, tmp_path, lost):
    """Each series is read from the index as far as its own files reach, and from the event file after that (this
    used to draw 0 steps with `dir.steps` gone, 1 of 4 gap groups' worth with a `dir.gaps.*` gone, and half the
    steps with the steps files of an upload pass that failed midway)."""
    run_dir = _copy(written, tmp_path)
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    if lost == "lagging steps":  # the steps files as the writer left them after chunk 50 of 100
        rows = 50 * PER_CHUNK - 1  # the fit's first step is its warm-up: no pyramid row
        _truncate_records(os.path.join(folder, "dir.steps"), 50)
        _truncate_records(os.path.join(folder, "steps.L0"), rows // index.STEPS_BLOCK)
        _truncate_records(os.path.join(folder, "steps.L1"), rows // index.STEPS_BLOCK // index.FAN)
    elif lost == "lagging dir.steps":  # its pyramid ahead of it: only the records it covers are read
        _truncate_records(os.path.join(folder, "dir.steps"), 50)
    else:
        os.remove(os.path.join(folder, lost))
    timeline, whole = _indexed(run_dir), _whole(run_dir)
    drawn = timeline.view(None, None, 1280)
    assert drawn["steps"]["total"] == whole["steps"]["total"] == CHUNKS * PER_CHUNK - 1
    assert drawn["gaps"]["total"] == whole["gaps"]["total"]
    for window in ((30.0, 34.0), (150.0, 154.0)):  # before and after where the lagging files end: exact
        short = timeline.view(*window, 1280)
        assert short["steps"] == _whole(run_dir, *window)["steps"] and short["steps"]["total"]
        assert short["gaps"] == _whole(run_dir, *window)["gaps"]
    for column in ("input_wait_ms", "compute_ms", "host_gap_ms"):  # every extreme drawn
        assert min(drawn["steps"][column]) == min(whole["steps"][column])
        assert max(drawn["steps"][column]) == max(whole["steps"][column])
    assert not timeline.errors
    assert [note for note in timeline.notes if f"lacks {lost}" in note] if lost.startswith("dir.") else \
        not timeline.notes, timeline.notes


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_a_series_that_stopped_early_does_not_make_the_first_read_scan_the_whole_file(tmp_path):
    """The warm-up phase, written once at the start, ends its directory there: the first read of an indexed run
    scanned the event file from that point, which is all of it (0.86 s of CPU for a cold /timeline at 1M steps,
    against 0.03-0.06 s). It starts where the digest's last record says every directory is whole."""
    run = LiveRun(str(tmp_path / "run" / "rnnmon"))
    run.writer.table(schema.PHASES_TAG, [(schema.PHASE_KINDS.index("warmup"), run.t - 0.5, run.t)])
    for _ in range(14):  # 140k steps: two digest records
        run.chunk(10_000)
    run.close()
    (event_file,) = glob.glob(os.path.join(run.run_dir, "events.out.tfevents.*"))
    size = os.path.getsize(event_file)
    _indexed(_copy(run.run_dir, tmp_path))  # what a first read imports is read once, not counted below
    before = bytes_read()
    timeline = _indexed(run.run_dir)
    read = bytes_read() - before - min(size, SCAN_BYTES)  # the head is read for the tags' descriptions
    # bytes, not time: 2.5x the file here (the head once more, the chunks after each series' last pyramid
    # record); 3.4x when the scan started at the warm-up
    assert read < 3 * size, (read, size)
    drawn, whole = timeline.view(None, None, 1280), _whole(run.run_dir)
    assert drawn["phases"] == whole["phases"] and "warmup" in drawn["phases"]["kind"]
    assert drawn["steps"]["total"] == whole["steps"]["total"] == 140_000 - 1 and not timeline.notes


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_a_cold_whole_run_view_of_an_indexed_run_reads_less_than_its_event_file(tmp_path):
    """Issue 30's cold /timeline (0.03-0.06 s of CPU at 1M steps): the first view of an indexed run read the file's
    head 1 MiB at a time for each 64 KiB it looked at (the tags' descriptions, and the GPUs', even in a run without
    any), and every series' rows after its last pyramid record from their chunks, drawn or not: 2.3x the event file
    here. It reads the head only as far as it looks, the GPUs' descriptions where a GPU is drawn, and the rows after
    a pyramid for a view that draws from it (intervals listed one by one are read from their own chunks)."""
    run = LiveRun(str(tmp_path / "run" / "rnnmon"))
    run.writer.table(schema.PHASES_TAG, [(schema.PHASE_KINDS.index("warmup"), run.t - 0.5, run.t)])
    for _ in range(400):  # 80k steps: one digest record; 400 chunks: steps and gaps drawn from their pyramids
        run.chunk(200)
    run.close()
    (event_file,) = glob.glob(os.path.join(run.run_dir, "events.out.tfevents.*"))
    size = os.path.getsize(event_file)
    _indexed(_copy(run.run_dir, tmp_path)).view(None, None, 200)  # what a first view imports, not counted below
    before = bytes_read()
    timeline = _indexed(run.run_dir)
    drawn = timeline.view(None, None, 200)  # 400 gaps: binned at 200 points
    read = bytes_read() - before
    # 0.58x: the last 14k steps, past the digest's last record, scanned; 64 KiB of head twice; the rest read
    assert read < 0.75 * size, (read, size)
    whole = _whole(run.run_dir, points=200)
    for drawn_kind in ("steps", "gaps", "phases"):
        assert drawn[drawn_kind]["total"] == whole[drawn_kind]["total"], drawn_kind
    assert drawn["gaps"]["binned"] and drawn["steps"]["total"] == 80_000 - 1 and not timeline.notes
