"""rnnmon runs written straight to event files: a GPU run of any length in milliseconds, and damaged runs.

They use rnnmon's own `SummaryWriter` and format, so TensorBoard's loaders read them exactly like a monitor's
output. Real fits (tests/tab/test_plugin.py) cover what the monitor writes; these cover what a fit on a 2-core CPU
cannot: many chunks, GPUs, one-sample dips, unreadable data.

Example:
    write_gpu_run(str(tmp_path / "long" / "rnnmon"), chunks=150)
"""

from __future__ import annotations

import glob
import os
import time

import numpy as np

from rnnmon.format import schema
from rnnmon.format.writer import SummaryWriter

STEP_S, WAIT_S, SAMPLE_S = 0.020, 0.006, 1 / 6


def write_gpu_run(run_dir: str, chunks: int, *, steps_per_chunk: int = 5, gpus: int = 1, status: str = "finished",
                  dip_at: int | None = None, samples_per_chunk: int = 12, start: float | None = None,
                  wait_s: float = WAIT_S, info: dict | None = None, step_s: float = STEP_S,
                  profile_at: float | None = None) -> None:
    """A run on `gpus` fake GPUs: each chunk holds steps, utilization samples, SM activity and an idle gap.

    `dip_at`: index of the single utilization sample (GPU 0) that reads 0%; all others read 60-95%.
    `wait_s`: the median input wait of a step. `step_s`: a step and its host gap (90% and 10% of it).
    `info`: more fields of the run description (e.g. a KerasTuner `trial`).
    `profile_at`: seconds after the start where a 0.1 s `profile` phase lies (a profiler starting).
    """
    writer = SummaryWriter(run_dir)
    t = time.time() - chunks * 2.0 if start is None else start
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": t,
                                 "backend": "tensorflow", "input_wait": "measured", "idle_pct": 5.0})
    rng = np.random.default_rng(0)
    step, sample = 0, 0
    chunk_s = max(steps_per_chunk * step_s, samples_per_chunk * SAMPLE_S)
    for chunk in range(chunks):
        begin = t + chunk * chunk_s + np.arange(steps_per_chunk) * step_s
        wait_ms = 1e3 * wait_s * rng.uniform(0.5, 1.5, steps_per_chunk)
        rows = [(step + i + 1, chunk // 10, b, b + step_s * 0.9, w, 1e3 * step_s * 0.1 if step + i else np.nan, 1)
                for i, (b, w) in enumerate(zip(begin, wait_ms))]
        writer.table(schema.STEPS_TAG, rows)
        step += steps_per_chunk
        times = t + chunk * chunk_s + np.arange(samples_per_chunk) * SAMPLE_S
        for index in range(gpus):
            util = rng.uniform(60, 95, samples_per_chunk)
            if index == 0 and dip_at is not None and sample <= dip_at < sample + samples_per_chunk:
                util[dip_at - sample] = 0.0
            device = {"index": index, "name": f"Fake GPU <{index}>"}
            writer.table(f"{schema.UTIL_TAG_PREFIX}{index}", np.column_stack([times, util]), device=device)
            stats = np.full((samples_per_chunk, len(schema.STAT_COLUMNS)), np.nan)
            stats[:, 0] = times
            stats[:, schema.STAT_COLUMNS.index("sm_activity_pct")] = util * 0.7
            writer.table(f"{schema.STATS_TAG_PREFIX}{index}", stats, device=device)
            writer.table(schema.GAPS_TAG, [(index, times[2], times[3], schema.GAP_CAUSES.index("input"))])
        sample += samples_per_chunk
    writer.table(schema.PHASES_TAG, [(schema.PHASE_KINDS.index("warmup"), t - 0.5, t),
                                     (schema.PHASE_KINDS.index("eval"), t + chunk_s, t + 1.5 * chunk_s)]
                 + ([] if profile_at is None else [(schema.PHASE_KINDS.index("profile"), t + profile_at,
                                                    t + profile_at + 0.1)]))
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": status, "start": t,
                                 "backend": "tensorflow", "input_wait": "measured", "idle_pct": 5.0, **(info or {})})
    writer.close()


class LiveRun:
    """A run being written, a chunk at a time, by rnnmon's writer (index and digest records included): steps of 20
    ms waiting ~6 ms for input, an input gap and GPU 0's samples per chunk.

    Example:
        run = LiveRun(str(tmp_path / "live" / "rnnmon")); run.chunk(1000); run.close()
    """

    def __init__(self, run_dir: str, start: float | None = None) -> None:
        self.run_dir, self.step, self.t = run_dir, 0, time.time() - 86400 if start is None else start
        self.writer = SummaryWriter(run_dir)
        self.writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "running", "start": self.t,
                                          "backend": "tensorflow", "input_wait": "measured", "idle_pct": 5.0})
        self._rng = np.random.default_rng(self.step)

    def chunk(self, steps: int) -> None:
        """`steps` more steps, their gap and samples, flushed (events, then index and digest)."""
        begin = self.t + np.arange(steps) * STEP_S
        first = np.arange(steps) + self.step == 0
        self.writer.table(schema.STEPS_TAG, np.column_stack([
            self.step + np.arange(steps) + 1, np.full(steps, self.step // 10_000), begin, begin + STEP_S * 0.9,
            1e3 * WAIT_S * self._rng.uniform(0.5, 1.5, steps), np.where(first, np.nan, 1e3 * STEP_S * 0.1),
            np.ones(steps)]))
        times = self.t + np.arange(0, steps * STEP_S, SAMPLE_S)
        self.writer.table(f"{schema.UTIL_TAG_PREFIX}0", np.column_stack([times, self._rng.uniform(60, 95, len(times))]),
                          device={"index": 0, "name": "Fake GPU <0>"})
        self.writer.table(schema.GAPS_TAG, [(0, times[0], times[1], schema.GAP_CAUSES.index("input"))])
        self.writer.flush()
        self.step, self.t = self.step + steps, self.t + steps * STEP_S

    def close(self) -> None:
        self.writer.close()


def write_writers(run_dir: str, writers: int, steps_each: int, chunk: int) -> None:
    """`writers` writers' file series in one run folder (processes on one log_dir before rnnmon's writer lock),
    each with steps 1..`steps_each` in chunks of `chunk`, their chunks interleaved."""
    series = [SummaryWriter(run_dir) for _ in range(writers)]
    t0 = time.time() - 600
    for writer in series:
        writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "finished", "start": t0})
    for first in range(0, steps_each, chunk):
        for index, writer in enumerate(series):
            rows = [(step + 1, 0, t0 + 0.05 * step + 0.02 * index, t0 + 0.05 * step + 0.02 * index + 0.015, 5.0,
                     np.nan if step == 0 else 1.0, 1) for step in range(first, first + chunk)]
            writer.table(schema.STEPS_TAG, rows)
            writer.flush()
    for writer in series:
        writer.close()


def write_unreadable_run(run_dir: str) -> None:
    """A run whose steps table has the wrong number of columns, as a damaged or foreign writer would leave."""
    writer = SummaryWriter(run_dir)
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "finished", "start": time.time()})
    writer.table(schema.STEPS_TAG, np.zeros((3, 4)))
    writer.close()


def write_bad_description_run(run_dir: str) -> None:
    """A run whose run description is a number instead of a JSON document; its steps are fine."""
    writer = SummaryWriter(run_dir)
    writer.table(schema.RUN_TAG, [[1.0]])
    writer.table(schema.STEPS_TAG, [(1, 0, 1.0, 1.01, 1.0, np.nan, 1), (2, 0, 1.02, 1.03, 1.0, 1.0, 1)])
    writer.close()


def truncate_event_file(run_dir: str, keep: float = 0.6, age_s: float = 0.0) -> None:
    """Cut the run's event file mid-record, as a crash during a write or a partial copy would; `age_s` > 0 dates
    the run's files that long ago (a cut a minute old is damage: no writer is still finishing the record)."""
    path = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))[0]
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * keep)])
    if age_s:
        then = time.time() - age_s
        for name in os.listdir(run_dir):
            os.utime(os.path.join(run_dir, name), (then, then))
