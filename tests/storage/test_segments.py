"""A remote run's writer starts a new event file (a segment) once the current one is old or large enough; each
segment reads on its own (metadata, run description and findings again), and the run reads whole across them."""

from __future__ import annotations

import os

import numpy as np

from rnnmon.format import index, schema
from rnnmon.format.reader import RunReader
from rnnmon.format.writer import SummaryWriter


def _rows(first: int, count: int) -> np.ndarray:
    steps = np.arange(first, first + count, dtype=np.float64)
    begin = 1000.0 + steps * 0.01
    return np.column_stack([steps, np.zeros(count), begin, begin + 0.008, np.full(count, 1.0), np.full(count, 0.5),
                            np.ones(count)])  # schema.STEP_COLUMNS


def test_segments_start_at_their_size_and_each_reads_on_its_own(tmp_path):
    run_dir = str(tmp_path / "rnnmon")
    writer = SummaryWriter(run_dir, segment_s=3600.0, segment_bytes=4096)
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": 1000.0})
    for chunk in range(12):
        writer.table(schema.STEPS_TAG, _rows(chunk * 50, 50))
        assert writer.flush()
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "finished", "start": 1000.0})
    writer.close()
    files = sorted(name for name in os.listdir(run_dir) if index.EVENT_FILE_MARK in name)
    assert len(files) >= 3, files
    assert all(os.path.isdir(index.index_folder(os.path.join(run_dir, name))) for name in files)  # each its index
    assert all(os.path.getsize(os.path.join(run_dir, name)) > 0 for name in files)  # no empty segment at the close
    whole = RunReader("rnnmon").update_from_files(run_dir)
    assert not whole.errors and whole.steps[:, 0].tolist() == list(range(600))
    assert whole.info["status"] == "finished"
    alone = tmp_path / "alone"
    alone.mkdir()
    os.link(os.path.join(run_dir, files[1]), alone / files[1])  # a middle segment alone: metadata and description
    part = RunReader("rnnmon").update_from_files(str(alone))
    assert not part.errors and len(part.steps) > 0 and part.info["status"] == "running"


def test_without_segments_a_run_stays_in_one_file(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    for chunk in range(12):
        writer.table(schema.STEPS_TAG, _rows(chunk * 50, 50))
        writer.flush()
    writer.close()
    assert len([name for name in os.listdir(tmp_path) if index.EVENT_FILE_MARK in name]) == 1
