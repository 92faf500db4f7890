"""What the upload thread puts, and in which order: a run's reading index before its event file (so the bucket's
index never names events its copy of the event file lacks), and the index with every `INDEX_EVERY`-th pass only."""

from __future__ import annotations

import os

import numpy as np
import pytest
from object_stores import ObjectStore

from rnnmon.format import index, schema
from rnnmon.format.writer import SummaryWriter
from rnnmon.storage import remote, uploader


def _write(writer: SummaryWriter, first: int, count: int = 80) -> None:
    steps = np.arange(first, first + count, dtype=np.float64)
    begin = 1000.0 + steps * 0.01
    writer.table(schema.STEPS_TAG, np.column_stack([steps, np.zeros(count), begin, begin + 0.008,
                                                    np.full(count, 1.0), np.full(count, 0.5), np.ones(count)]))
    assert writer.flush()


def test_the_index_is_listed_before_the_event_file_it_describes(tmp_path):
    run_dir = str(tmp_path / "rnnmon")
    writer = SummaryWriter(run_dir)
    _write(writer, 0)
    files = [rel for rel, _ in uploader.Uploader(run_dir, "s3://bucket/run/rnnmon")._files()]
    event = next(i for i, rel in enumerate(files) if index.EVENT_FILE_MARK in rel)
    assert event > 0 and all(rel.startswith(index.INDEX_DIR) for rel in files[:event]), files  # written after it
    writer.close()


@pytest.mark.slow
def test_the_index_goes_up_with_every_tenth_pass_and_the_event_file_with_each(tmp_path, monkeypatch):
    with ObjectStore("s3") as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        server.make_bucket()
        run_dir = str(tmp_path / "rnnmon")
        writer = SummaryWriter(run_dir)
        up = uploader.Uploader(run_dir, server.url("run/rnnmon"), interval_s=0.0)
        fs, root = remote.filesystem(server.url("run/rnnmon"))

        def sizes() -> dict[str, int]:
            fs.invalidate_cache()
            return {path[len(root):].strip("/"): info["size"] for path, info in fs.find(root, detail=True).items()}

        first_sizes = []
        for n in range(uploader.INDEX_EVERY + 1):
            _write(writer, 80 * n)
            assert up._pass(final=False)
            first_sizes.append(sizes())
        (event,) = [rel for rel in first_sizes[0] if index.EVENT_FILE_MARK in rel]
        steps_index = next(rel for rel in first_sizes[0] if rel.endswith("dir.steps"))
        assert len({s[event] for s in first_sizes}) == uploader.INDEX_EVERY + 1  # the event file: every pass
        assert [s[steps_index] for s in first_sizes[1:-1]] == [first_sizes[0][steps_index]] * (
            uploader.INDEX_EVERY - 1) and first_sizes[-1][steps_index] > first_sizes[0][steps_index]
        writer.close()
        assert up._pass(final=True) and sizes()[steps_index] == os.path.getsize(os.path.join(run_dir, steps_index))
