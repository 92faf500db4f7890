"""Event files that are not what their names say, and files that change under a live reader.

A FIFO, a link to /dev/zero and a huge sparse file named like an event file are errors of their run; `rnnmon report`
runs as a subprocess with a deadline and a 3 GiB address-space limit, so a hang or a MemoryError fails the test. A
live file cut mid-record or at a record, then appended to by its writer, is read on past the cut, each record once.
"""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import bytes_read
from synthetic_runs import write_gpu_run

from rnnmon.format import schema
from rnnmon.format.eventfile import RecordCursor, frame, scan_records
from rnnmon.format.logdir import read_logdir
from rnnmon.format.reader import RunReader
from rnnmon.format.writer import SummaryWriter

T0 = 1_790_000_000.0
MEMORY_LIMIT = 3 << 30  # the limit: the report died with MemoryError under it
DEADLINE_S = 60  # a report of two small runs takes ~2 s; a hang runs into this
SPARSE_BYTES = 8 << 30
_REPORT = ("import sys\n"
           "from rnnmon.cli import main\n"
           "code = main(sys.argv[1:])\n"
           "with open('/proc/self/io') as f:\n"  # bytes this process read (imports included)
           "    print(dict(line.split(': ') for line in f.read().splitlines())['rchar'], file=sys.stderr)\n"
           "sys.exit(code)\n")


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _plant(path: str, kind: str) -> None:
    """Something that is not an event file, named like one, at `path`."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    else:  # an 8 GiB file of zeros that takes no disk space
        with open(path, "wb") as f:
            f.truncate(SPARSE_BYTES)


@pytest.mark.parametrize(("kind", "complaint"), [
    ("fifo", "not a regular file (a FIFO)"),
    ("dev_zero", "not a regular file (a character device)"),
    ("sparse", "corrupt record header at byte 0"),
])
def test_report_names_a_hostile_event_file_and_reads_every_run(tmp_path, kind, complaint):
    write_gpu_run(str(tmp_path / "healthy" / "rnnmon"), 5)
    write_gpu_run(str(tmp_path / "hostile" / "rnnmon"), 5)
    name = "events.out.tfevents.9999999999.hostile"
    _plant(str(tmp_path / "hostile" / "rnnmon" / name), kind)
    result = subprocess.run([sys.executable, "-c", _REPORT, "report", "--json", str(tmp_path)], capture_output=True,
                            text=True, timeout=DEADLINE_S, preexec_fn=_limit_memory)  # a hang: TimeoutExpired
    assert result.returncode == 0, result.stderr[-2000:]
    runs = {run["run"]: run for run in json.loads(result.stdout)["runs"]}
    assert set(runs) == {"healthy/rnnmon", "hostile/rnnmon"}
    assert runs["healthy/rnnmon"]["errors"] == [] and runs["healthy/rnnmon"]["steps"] == 25
    assert runs["hostile/rnnmon"]["steps"] == 25  # its real event file read
    assert [error for error in runs["hostile/rnnmon"]["errors"] if complaint in error and name in error], \
        runs["hostile/rnnmon"]["errors"]
    bytes_read = int(result.stderr.strip().splitlines()[-1])
    assert bytes_read < 256 << 20  # a bounded prefix, not the 8 GiB or an endless /dev/zero (imports: ~60 MB)


def test_a_scan_returns_a_bounded_batch_and_the_next_one_the_rest(tmp_path):
    records = [bytes([i]) * 1000 for i in range(100)]
    path = str(tmp_path / "events.out.tfevents.1")
    with open(path, "wb") as f:
        f.write(b"".join(frame(record) for record in records))
    cursor = RecordCursor()
    scans = [cursor.scan(path, max_bytes=10_000)]  # 10,000 bytes: ten records of 1,016
    while scans[-1].more:
        scans.append(cursor.scan(path, max_bytes=10_000))
    assert [len(scan.records) for scan in scans] == [10] * 10
    assert [record for scan in scans for record in scan.records] == records
    assert cursor.scan(path).records == []  # nothing new


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_a_scan_of_a_few_bytes_reads_about_those_bytes_not_a_whole_read_chunk(tmp_path):
    """A file's head is read 64 KiB at a time (`index_located.head_records`), for the tags' descriptions and the GPUs:
    each of those scans read 1 MiB ahead, 16 MiB for the first MiB of a run without GPUs."""
    records = [bytes([i % 256]) * 1000 for i in range(3000)]  # 3 MB of records
    path = str(tmp_path / "events.out.tfevents.1")
    with open(path, "wb") as f:
        f.write(b"".join(frame(record) for record in records))
    cursor = RecordCursor()
    before = bytes_read()
    scans = [cursor.scan(path, max_bytes=10_000) for _ in range(3)]
    read = bytes_read() - before
    assert [len(scan.records) for scan in scans] == [10] * 3 and scans[-1].more
    assert read < 3 * (10_000 + 1016), read  # each scan its bytes and the record that crosses its end


def _writer(run_dir: str) -> SummaryWriter:
    writer = SummaryWriter(run_dir)
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": T0})
    return writer


def _chunk(writer: SummaryWriter, first: int, count: int = 10) -> None:
    """Steps `first` .. `first + count - 1`, flushed: one record."""
    writer.table(schema.STEPS_TAG, [(step, 0, T0 + 0.05 * step, T0 + 0.05 * step + 0.04, 5.0, 1.0, 1)
                                    for step in range(first, first + count)])
    writer.flush()


def _event_file(run_dir: str) -> str:
    (path,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    return path


def _live_run_read_to_step_40(tmp_path):
    """A live run's writer after 40 steps, a reader that has read them, the run folder and its event file."""
    run_dir = str(tmp_path / "live" / "rnnmon")
    writer = _writer(run_dir)
    for first in range(1, 41, 10):
        _chunk(writer, first)
    reader = RunReader("live/rnnmon")
    assert len(reader.update_from_files(run_dir).steps) == 40
    path = _event_file(run_dir)
    return writer, reader, run_dir, path


def test_a_live_file_cut_mid_record_then_appended_is_read_on_past_the_cut(tmp_path):
    writer, reader, run_dir, path = _live_run_read_to_step_40(tmp_path)
    last = len(frame(scan_records(path).records[-1]))
    cut = os.path.getsize(path) - last // 2
    os.truncate(path, cut)  # inside the last record (steps 31-40), which the reader has read
    _chunk(writer, 41)  # the writer appends at the cut
    _chunk(writer, 51)
    writer.close()
    data = reader.update_from_files(run_dir)
    np.testing.assert_array_equal(data.steps[:, 0], np.arange(1, 61))  # every step once: the new ones read
    assert [error for error in data.errors if f"byte {cut - (last - last // 2)}" in error and "skipped" in error], \
        data.errors
    fresh = read_logdir(str(tmp_path))["live/rnnmon"]  # a new reader: the same damage, the cut chunk lost
    np.testing.assert_array_equal(fresh.steps[:, 0], np.r_[1:31, 41:61])
    assert fresh.errors == data.errors


def test_a_live_file_cut_at_a_record_then_rewritten_reads_each_record_once(tmp_path):
    writer, reader, run_dir, path = _live_run_read_to_step_40(tmp_path)
    with open(path, "rb") as f:
        original = f.read()
    records = scan_records(path).records
    third = len(frame(records[-2]))
    boundary = len(original) - third - len(frame(records[-1]))
    os.truncate(path, boundary)  # steps 21-40 gone: below what the reader has read
    data = reader.update_from_files(run_dir)
    assert len(data.steps) == 40 and data.errors == []
    with open(path, "ab") as f:  # the same bytes again (a writer retrying what it had cut back), then new steps
        f.write(original[boundary:boundary + third])
    _chunk(writer, 41)
    writer.close()
    data = reader.update_from_files(run_dir)
    np.testing.assert_array_equal(data.steps[:, 0], np.arange(1, 51))  # steps 21-30 not twice; 41-50 read
    assert data.errors == []


def test_reading_goes_on_after_a_damaged_record_header(tmp_path):
    run_dir = str(tmp_path / "damaged" / "rnnmon")
    writer = _writer(run_dir)
    for first in range(1, 51, 10):
        _chunk(writer, first)
    writer.close()
    path = _event_file(run_dir)
    records = scan_records(path).records
    second_chunk = sum(len(frame(record)) for record in records[:-4])  # the record of steps 11-20
    with open(path, "r+b") as f:
        f.seek(second_chunk + 2)
        f.write(b"\xff")  # its length, three bytes in: 16 MiB more than it is
    data = read_logdir(str(tmp_path))["damaged/rnnmon"]
    np.testing.assert_array_equal(data.steps[:, 0], np.r_[1:11, 21:51])  # only the damaged record lost
    assert [error for error in data.errors if f"corrupt record header at byte {second_chunk}" in error], data.errors


INDEXED_STEPS = 70_000  # one digest record (65,536 steps) and a tail: what a summary reads through its index


@pytest.fixture(scope="module")
def indexed_logdir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("indexed")
    write_gpu_run(str(logdir / "run" / "rnnmon"), INDEXED_STEPS // 1000, steps_per_chunk=1000)
    return str(logdir)


def _index_file(run_dir: str, name: str) -> str:
    (folder,) = glob.glob(os.path.join(run_dir, "rnnmon-index", "*"))
    return os.path.join(folder, name)


@pytest.mark.parametrize(("name", "kind"), [
    ("dir.steps", "fifo"), ("digest", "sparse"),
    *(pytest.param(name, kind, marks=pytest.mark.slow) for name, kind in (
        ("dir.gaps.d0.c0", "fifo"), ("dir.docs", "fifo"), ("digest", "fifo"), ("dir.docs", "sparse"),
        ("dir.steps", "sparse"))),
])
def test_report_reads_a_run_whole_when_an_index_or_digest_file_is_hostile(indexed_logdir, tmp_path, name, kind):
    """Index and digest files are opened like event files: a FIFO is refused at once (it used to hold the report
    past 120 s), a 2 GiB sparse file is never read whole (it cost 2.1-2.5 GB or a MemoryError)."""
    logdir = str(tmp_path / "logdir")
    shutil.copytree(indexed_logdir, logdir)
    path = _index_file(os.path.join(logdir, "run", "rnnmon"), name)
    os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as f:
            f.truncate(2 << 30)
    result = subprocess.run([sys.executable, "-c", _REPORT, "report", "--json", logdir], capture_output=True,
                            text=True, timeout=DEADLINE_S, preexec_fn=_limit_memory)  # a hang: TimeoutExpired
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = json.loads(result.stdout)["runs"]
    assert run["steps"] == INDEXED_STEPS and run["errors"] == []
    assert [note for note in run["notes"] if "read whole" in note and name in note], run["notes"]
    bytes_read = int(result.stderr.strip().splitlines()[-1])
    assert bytes_read < 256 << 20  # the run's files and the imports, never the 2 GiB


def test_only_a_cut_through_records_is_a_cut():
    """The tab serves a run whose only damage is a cut (its records around it read), and answers 422 for the rest."""
    from rnnmon.format.eventfile import is_cut, truncated_at

    name = "events.out.tfevents.1.x"
    cuts = (f"{name}: {truncated_at(120)}",
            f"{name}: record at byte 9 cut short: bytes 9-80 skipped, read on from the next whole record",
            f"{name}: corrupt record at byte 816 (data checksum mismatch): bytes 816-951 skipped, read on from the "
            "next whole record; record at byte 990 cut short: bytes 990-1000 skipped, read on from the next whole "
            "record")
    others = (f"{name}: corrupt record at byte 5 (data checksum mismatch; skipped)",
              f"{name}: corrupt record header at byte 0 (no whole record after it)",
              f"{name}: corrupt record at byte 5 (data checksum mismatch; skipped); record at byte 9 cut short: "
              "bytes 9-80 skipped, read on from the next whole record",
              f"{name}: not a regular file (a FIFO)", "rnnmon/steps at step 3: expected rows of 7 columns")
    assert all(is_cut(error) for error in cuts) and not any(is_cut(error) for error in others)
