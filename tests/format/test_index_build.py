"""A run without its reading index (written before it, or copied without `rnnmon-index/`) gets one built by its first
reader, in one pass, kept beside the run or in the user's cache: later reads cost what an indexed run costs."""

from __future__ import annotations

import glob
import os
import shutil

from rnnmon.analysis.summary import summarize
from rnnmon.format import index
from rnnmon.format.digest_read import read_run
from rnnmon.format.index_query import RunIndex
from rnnmon.format.run_lock import RunLock
from tests.synthetic_runs import write_gpu_run


def _files(folder: str) -> dict[str, bytes]:
    out = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as file:
            out[name] = file.read()
    return out


def _unindexed(tmp_path) -> tuple[str, str, dict[str, bytes]]:
    """A 70k-step run (a digest record and a tail) without its index: its folder, its event file, and the files
    its writer had written into its index."""
    run_dir = str(tmp_path / "run" / "rnnmon")
    write_gpu_run(run_dir, 70, steps_per_chunk=1000)
    (folder,) = glob.glob(os.path.join(run_dir, index.INDEX_DIR, "*"))
    written = _files(folder)
    shutil.rmtree(os.path.join(run_dir, index.INDEX_DIR))
    (path,) = glob.glob(os.path.join(run_dir, "*tfevents*"))
    return run_dir, path, written


def test_the_index_a_reader_builds_is_the_one_its_writer_wrote(tmp_path):
    """Without its index, every process read a 10M-step run whole for its summary (26.9 s CPU, +3.09 GB) and wrote
    nothing back: the first read now builds it beside the run, the same files the writer writes."""
    run_dir, path, written = _unindexed(tmp_path)
    data = read_run(run_dir, "run/rnnmon")
    built = _files(index.index_folder(path))
    assert sorted(built) == sorted(written) and data.digest.steps.rows == 70_000
    assert {name: data for name, data in built.items() if name != "digest"} == {
        name: data for name, data in written.items() if name != "digest"}  # index records byte for byte
    assert len(built["digest"]) == len(written["digest"])  # a record; its sums added in another grouping
    rebuilt = summarize(data)
    shutil.rmtree(os.path.join(run_dir, index.INDEX_DIR))
    os.makedirs(os.path.dirname(index.index_folder(path)))
    os.mkdir(index.index_folder(path))
    for name, content in written.items():
        with open(os.path.join(index.index_folder(path), name), "wb") as out:
            out.write(content)
    assert summarize(read_run(run_dir, "run/rnnmon")) == rebuilt


def test_a_run_folder_that_cannot_be_written_keeps_its_built_index_in_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run_dir, path, _ = _unindexed(tmp_path)
    with open(os.path.join(run_dir, index.INDEX_DIR), "w"):
        pass  # a file where the index folder belongs: nothing can be made beside the run (as root, modes do not)
    first = summarize(read_run(run_dir, "run/rnnmon"))
    (cached,) = glob.glob(str(tmp_path / "cache" / "rnnmon" / index.INDEX_DIR / "*"))
    assert cached == index.cached_index_folder(path) and "digest" in os.listdir(cached)
    built = {name: os.stat(os.path.join(cached, name)).st_mtime_ns for name in os.listdir(cached)}
    assert summarize(read_run(run_dir, "run/rnnmon")) == first and first["steps"] == 70_000
    assert {name: os.stat(os.path.join(cached, name)).st_mtime_ns for name in os.listdir(cached)} == built  # kept
    drawn = RunIndex(run_dir)
    drawn.refresh()
    assert [file.folder for file in drawn.files.values()] == [cached] and not drawn.notes


def test_a_file_a_live_monitor_writes_is_left_to_its_writer(tmp_path):
    run_dir, _, _ = _unindexed(tmp_path)
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        assert read_run(run_dir, "run/rnnmon") is None  # read whole; its writer indexes its own files
        assert not os.path.exists(os.path.join(run_dir, index.INDEX_DIR))
    finally:
        lock.release()
    assert read_run(run_dir, "run/rnnmon").digest.steps.rows == 70_000
