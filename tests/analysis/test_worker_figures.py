"""A worker's figures for the straggler search (`worker_figures`) are `summarize`'s, on real fits and on synthetic
runs of every shape the summary reads differently: short, past the digest's row cap, read through the digest of
an index, several GPUs, input wait unmeasured or sampled, too few steps.

The tab's `/workers` summarized every worker in full (2,000 workers: 14.7 s CPU for the first request, where 3 s
was wanted); it now computes these figures alone, and `rnnmon report` compares workers by them too."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import stalled_dataset, tiny_model
from synthetic_runs import LiveRun, write_gpu_run

from rnnmon.analysis.digest_figures import _percentiles
from rnnmon.analysis.summary import summarize
from rnnmon.analysis.worker_figures import READ_TAG_PREFIXES, READ_TAGS, worker_figures
from rnnmon.format import schema
from rnnmon.format.digest import CAP
from rnnmon.format.logdir import read_logdir
from rnnmon.format.reader import RunReader
from rnnmon.format.writer import SummaryWriter


def _summarized(summary: dict) -> dict:
    """The figures `worker_figures` gives, as `summarize` reports them."""
    wait = summary["input_wait_ms"]
    return {"run": summary["run"], "judged": summary["verdict"] != "insufficient-data", "steps": summary["steps"],
            "step_ms": summary["step_ms"]["median"], "input_wait_ms": None if wait is None else wait["median"],
            "wall_s": summary["wall_s"], "host_gap_fraction": summary["host_gap_fraction"],
            "gpu_idle_fractions": [gpu["idle_fraction"] for gpu in summary["gpus"]]}


def _assert_same(logdir: str) -> dict:
    runs = read_logdir(logdir)
    assert runs
    for run in runs.values():
        assert worker_figures(run) == _summarized(summarize(run)), run.run
    return runs


def _write_steps(run_dir: str, rows: list[tuple], util: np.ndarray | None = None, idle_pct: float = 5.0) -> None:
    writer = SummaryWriter(run_dir)
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "finished", "idle_pct": idle_pct})
    writer.table(schema.STEPS_TAG, rows)
    if util is not None:
        writer.table(f"{schema.UTIL_TAG_PREFIX}1", util, device={"index": 1})
    writer.close()


def test_figures_are_the_summarys_on_synthetic_runs(tmp_path):
    write_gpu_run(str(tmp_path / "plain" / "rnnmon"), 6)
    write_gpu_run(str(tmp_path / "gpus" / "rnnmon"), 8, gpus=3, dip_at=7, wait_s=0.011, profile_at=0.3,
                  info={"idle_pct": 62.5})  # a threshold inside the samples' range: some idle, some not
    write_gpu_run(str(tmp_path / "few" / "rnnmon"), 1)  # 5 steps: insufficient data
    t0 = 1.7e9
    rows = [(i + 1, i // 4, t0 + 0.05 * i, t0 + 0.05 * i + 0.03 + 0.001 * (i % 5), np.nan if i % 3 else 2.0 + i,
             np.nan if i in (0, 12) else 4.0, 1 + i % 2) for i in range(24)]  # two fits; every third wait timed
    _write_steps(str(tmp_path / "sampled" / "rnnmon"), rows, np.column_stack([t0 + np.arange(9), np.r_[
        np.arange(8.0), np.nan]]), idle_pct=3.0)
    _write_steps(str(tmp_path / "unmeasured" / "rnnmon"), [(*row[:4], np.nan, *row[5:]) for row in rows])
    _write_steps(str(tmp_path / "empty" / "rnnmon"), [])
    runs = _assert_same(str(tmp_path))
    assert not worker_figures(runs["few/rnnmon"])["judged"] and worker_figures(runs["plain/rnnmon"])["judged"]
    assert worker_figures(runs["unmeasured/rnnmon"])["input_wait_ms"] is None
    assert len(worker_figures(runs["gpus/rnnmon"])["gpu_idle_fractions"]) == 3


def test_figures_are_the_summarys_past_the_digests_row_cap_and_from_an_index(tmp_path):
    # Past CAP rows a summary's figures come from the digest's buckets; an indexed run is read through its digest.
    write_gpu_run(str(tmp_path / "long" / "rnnmon"), 7, steps_per_chunk=CAP // 6, samples_per_chunk=CAP // 6)
    live = LiveRun(str(tmp_path / "indexed" / "rnnmon"))
    for _ in range(3):
        live.chunk(CAP // 2)
    live.close()
    _assert_same(str(tmp_path))
    indexed = read_logdir(str(tmp_path), digest=True)["indexed/rnnmon"]
    assert indexed.digest is not None and indexed.digest.steps.raw is None  # the approximate figures
    assert worker_figures(indexed) == _summarized(summarize(indexed))


def test_figures_need_only_the_tables_a_reader_of_them_reads(tmp_path):
    # The tab reads a worker with READ_TAGS and READ_TAG_PREFIXES alone: the figures must be the same.
    run_dir = str(tmp_path / "gpus" / "rnnmon")
    write_gpu_run(run_dir, 6, gpus=2, dip_at=3)
    whole = RunReader("gpus/rnnmon").update_from_files(run_dir)
    part = RunReader("gpus/rnnmon", tags=READ_TAGS, tag_prefixes=READ_TAG_PREFIXES).update_from_files(run_dir)
    assert len(part.gaps) == 0 and not part.stats and set(part.util) == {0, 1}  # the rest is not read
    assert worker_figures(part) == worker_figures(whole)


def test_percentiles_are_numpys():
    # The summary's medians and 90th percentiles are computed without np.percentile's 90 us a call, by its arithmetic.
    rng = np.random.default_rng(3)
    for size in [*range(1, 40), 1000, 4097]:
        values = rng.lognormal(0, 2, size) * rng.choice([1e-3, 1.0, 1e3])
        values[rng.random(size) < 0.2] = np.nan
        kept = values[~np.isnan(values)]
        expected = ({"median": None, "p90": None} if not len(kept) else
                    dict(zip(("median", "p90"), (round(float(v), 4) for v in np.percentile(kept, [50, 90])))))
        assert _percentiles(values) == expected


@pytest.mark.slow
def test_figures_are_the_summarys_on_real_fits(tmp_path):
    from rnnmon import UtilizationMonitor

    monitor = UtilizationMonitor(str(tmp_path / "fit"))
    model = tiny_model()
    model.fit(stalled_dataset(14, 0.01), epochs=2, verbose=0, callbacks=[monitor])
    model.fit(stalled_dataset(6), epochs=1, verbose=0, callbacks=[monitor])  # a second fit in the same run
    tiny_model().fit(stalled_dataset(5), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path / "few"))])
    runs = _assert_same(str(tmp_path))
    assert worker_figures(runs["fit/rnnmon"])["judged"] and not worker_figures(runs["few/rnnmon"])["judged"]
