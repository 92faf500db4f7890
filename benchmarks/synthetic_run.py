"""Long rnnmon runs written through rnnmon's own Recorder and SummaryWriter on a virtual clock, in seconds.

Two kinds, both with synthetic step timings (20 ms steps) and a flush every 2 virtual seconds as a monitor does:
- `input`: a CPU run (no GPU) whose input pipeline stalls 6-14 ms per step; the recorder's step-gap detector
  finds an idle gap at almost every step (~900k gaps for 1M steps).
- `gpu`: a run on one GPU, with utilization samples at 6 Hz (busy 60-95%) and a single-sample 0% dip every
  `dip_every` samples, fed to the recorder through a sampler stand-in on the same virtual clock.

The run ends now (its Unix times are the virtual clock shifted so), so TensorBoard shows it as recent.

Usage:
    python benchmarks/synthetic_run.py LOGDIR/run/rnnmon --steps 1000000 --kind input
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from rnnmon import metadata as md
from rnnmon.recorder import Recorder
from rnnmon.writer import SummaryWriter

STEP_S, FLUSH_S, SAMPLE_S = 0.020, 2.0, 1 / 6


class VirtualSampler:
    """The Sampler interface (`describe`, `drain`) over synthetic utilization samples on the virtual clock."""

    def __init__(self, dip_every: int, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)
        self._next_s = 0.0
        self._count = 0
        self._dip_every = dip_every
        self._until_s = 0.0

    def advance(self, until_s: float) -> None:
        self._until_s = until_s

    def describe(self) -> list[dict[str, Any]]:
        return [{"index": 0, "name": "Virtual GPU", "uuid": "GPU-virtual"}]

    def drain(self) -> tuple[dict[int, list], dict[int, list], list]:
        times = np.arange(self._next_s, self._until_s, SAMPLE_S)
        self._next_s = self._next_s + len(times) * SAMPLE_S
        util = self._rng.uniform(60, 95, len(times))
        index = self._count + np.arange(len(times))
        util[index % self._dip_every == self._dip_every // 2] = 0.0
        self._count += len(times)
        stats = np.full((len(times), len(md.STAT_COLUMNS)), np.nan)
        stats[:, 0] = times
        stats[:, md.STAT_COLUMNS.index("sm_activity_pct")] = util * 0.7
        return ({0: list(zip(times.tolist(), util.tolist()))}, {0: [tuple(row) for row in stats.tolist()]}, [])


def write_run(run_dir: str, steps: int, kind: str = "input", *, dip_every: int = 997, seed: int = 0,
              status: str = "finished") -> dict[str, float]:
    """Write a `kind` run of `steps` steps into `run_dir`; returns its virtual duration and wall time taken."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    duration_s = steps * STEP_S
    offset = time.time() - duration_s - 1.0
    writer = SummaryWriter(run_dir)
    sampler = VirtualSampler(dip_every, seed) if kind == "gpu" else None
    recorder = Recorder(writer, sampler, wall_offset_s=offset)
    writer.json(md.RUN_TAG, {"version": md.FORMAT_VERSION, "status": "running", "start": offset, "pid": 1,
                             "backend": "tensorflow", "input_wait": "measured", "idle_pct": 5.0})
    recorder.add_phase("warmup", 0.0, STEP_S)
    wait_s = rng.uniform(0.006, 0.014, steps) if kind == "input" else rng.uniform(0.0002, 0.001, steps)
    gap_s = np.full(steps, 0.00005)
    gap_s[0] = np.nan
    per_chunk = int(FLUSH_S / STEP_S)
    for first in range(0, steps, per_chunk):
        for i in range(first, min(steps, first + per_chunk)):
            begin = (i + 1) * STEP_S
            recorder.add_step((i + 1, 0, begin, begin + STEP_S - 0.00005, float(wait_s[i]), float(gap_s[i]), 1))
        horizon = (min(steps, first + per_chunk) + 1) * STEP_S
        if sampler is not None:
            sampler.advance(horizon)
        recorder.flush(horizon=horizon)
    recorder.flush(horizon=duration_s + STEP_S, final=True)
    writer.json(md.RUN_TAG, {"version": md.FORMAT_VERSION, "status": status, "start": offset, "pid": 1,
                             "backend": "tensorflow", "input_wait": "measured", "idle_pct": 5.0})
    writer.close()
    return {"virtual_s": duration_s, "write_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--kind", choices=("input", "gpu"), default="input")
    args = parser.parse_args()
    print(write_run(args.run_dir, args.steps, args.kind))


if __name__ == "__main__":
    main()
