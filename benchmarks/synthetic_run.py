"""Long rnnmon runs written through rnnmon's own Recorder and SummaryWriter on a virtual clock.

Two kinds, as issue 10 asks for its benchmarks (20 ms steps, a flush every 2 virtual seconds, as a monitor does):
- `input`: a CPU-only, input-bound run: every step waits 9.5-14 ms for its batch, so (with the default 10 ms
  `min_gap`) the recorder's step-gap detector finds an idle gap at most steps (~900k for 1M steps).
- `gpu`: a GPU run through the fake NVML library (tests/fake_nvml.py driving the real pynvml binding), polled
  every 0.5 s of virtual time: utilization 60-95% at 6 Hz, a single-sample 0% dip every `dip_every` samples,
  and an evaluation (GPU idle) after every 10,000-step epoch.

The run ends now (its Unix times are the virtual clock shifted so), so TensorBoard shows it as recent.

Nothing trains and nothing sleeps: step stamps come from a seeded random model of a step, the clock is virtual,
and the Recorder, Sampler, gap detectors and writer are the ones a fit uses. Only stdlib, numpy, pynvml and
rnnmon are needed (no pytest), so this runs in a plain `pip install .` environment.

Usage:
    python benchmarks/synthetic_run.py LOGDIR/run/rnnmon [--kind input|gpu] [--steps 1000000]
    # prints steps, bytes, bytes per step and per second, virtual and write seconds

Example:
    >>> from synthetic_run import write_run
    >>> write_run("/tmp/logs/long/rnnmon", 10_000, "input")["bytes_per_step"]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from rnnmon.capture.recorder import Recorder
from rnnmon.format import schema
from rnnmon.format.writer import SummaryWriter

SAMPLE_INTERVAL_S = 0.5  # UtilizationMonitor's defaults
FLUSH_S = 2.0
STEP_S = 0.020
STEPS_PER_EPOCH = 10_000
EVAL_S = 1.5  # an evaluation after every epoch: the GPU idles


class VirtualClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def _fake_gpu(clock: VirtualClock, idle: list[tuple[float, float]], dip_every: int, seed: int) -> Iterator[Any]:
    """A Sampler over the fake NVML library from tests/fake_nvml.py (the real pynvml binding runs)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from fake_nvml import FakeGpu, FakeNvmlLib, installed

    noise = np.random.default_rng(seed).uniform(60, 95, 4096)

    def utilization(t: float) -> float:
        sample = round(t * 6)  # the fake library samples at 6 Hz on its own grid
        if sample % dip_every == dip_every // 2 or any(start <= t <= end for start, end in idle[-2:]):
            return 0.0
        return float(round(noise[sample % len(noise)]))

    lib = FakeNvmlLib([FakeGpu(utilization=utilization)], clock=clock)
    with installed(lib):
        from rnnmon.gpu.nvml import Nvml
        from rnnmon.gpu.sampler import Sampler

        nvml = Nvml()
        nvml.start()
        sampler = Sampler(nvml, [0], clock=clock)
        yield sampler
        sampler.close()


def write_run(run_dir: str, steps: int = 1_000_000, kind: str = "input", *, dip_every: int = 997, seed: int = 0,
              status: str = "finished") -> dict[str, Any]:
    """Write a `kind` run of `steps` steps into `run_dir` (a `.../rnnmon` directory); returns its size figures."""
    started = time.perf_counter()
    clock = VirtualClock()
    rng = np.random.default_rng(seed)
    wait = rng.uniform(0.0095, 0.014, steps) if kind == "input" else rng.uniform(0.0002, 0.001, steps)
    host = rng.uniform(0.00003, 0.00008, steps)
    virtual_s = steps * STEP_S + (steps - 1) // STEPS_PER_EPOCH * EVAL_S
    offset = time.time() - virtual_s - 1.0 - clock.now  # the run ends now
    idle: list[tuple[float, float]] = []
    writer = SummaryWriter(run_dir)
    description: dict[str, Any] = {
        "version": schema.FORMAT_VERSION, "status": "running", "start": clock.now + offset, "end": None,
        "backend": "tensorflow", "keras": "3", "host": "synthetic", "pid": 1, "steps_per_execution": 1,
        "input_wait": "measured", "idle_pct": 5.0, "gpus": [], "nvml": "unavailable"}
    with contextlib.ExitStack() as stack:
        sampler = stack.enter_context(_fake_gpu(clock, idle, dip_every, seed)) if kind == "gpu" else None
        if sampler is not None:
            description.update(gpus=sampler.describe(), nvml="available")
        writer.json(schema.RUN_TAG, description)
        recorder = Recorder(writer, sampler, offset)
        recorder.add_phase("warmup", clock.now - 0.5, clock.now)
        next_poll, next_flush, last_end = clock.now, clock.now + FLUSH_S, clock.now
        for i in range(steps):
            begin = last_end + host[i]
            end = last_end + STEP_S
            recorder.add_step((i + 1, i // STEPS_PER_EPOCH, begin, end, wait[i], math.nan if i == 0 else host[i], 1))
            clock.now = last_end = end
            if (i + 1) % STEPS_PER_EPOCH == 0 and i + 1 < steps:
                idle.append((end, end + EVAL_S))
                recorder.add_phase("eval", end, end + EVAL_S)
                clock.now = last_end = end + EVAL_S
            while sampler is not None and next_poll <= clock.now:
                sampler.poll()
                next_poll += SAMPLE_INTERVAL_S
            if clock.now >= next_flush:
                recorder.flush(horizon=last_end)
                next_flush = clock.now + FLUSH_S
        recorder.flush(horizon=last_end, final=True)
    description.update(status=status, end=last_end + offset, steps=steps)
    writer.json(schema.RUN_TAG, description)
    writer.close()
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    return {"run_dir": run_dir, "kind": kind, "steps": steps, "bytes": size, "bytes_per_step": round(size / steps, 2),
            "bytes_per_second": round(size / virtual_s, 1), "virtual_s": round(virtual_s, 1),
            "write_s": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="where the event file goes, e.g. LOGDIR/long/rnnmon")
    parser.add_argument("--kind", choices=("input", "gpu"), default="input")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--dip-every", type=int, default=997, help="gpu: one 0%% sample in this many")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(write_run(args.run_dir, args.steps, args.kind, dip_every=args.dip_every, seed=args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
