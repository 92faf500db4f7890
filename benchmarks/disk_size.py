"""Bytes on disk per step and per GPU-second: synthetic runs and a real fit, tag by tag.

Each event's bytes (its TFRecord framing included) are shared among its values in proportion to their size,
then summed per group of tags:
- `steps`: `rnnmon/steps`, per step;
- `gpu`: `rnnmon/util/gpu*`, `rnnmon/stats/gpu*` and the `rnnmon/gpu*/` scalars, per GPU-second;
- `gaps`, `scalars` (the run-wide Scalars-tab means), `other` (host, phases, documents, file header).

The real fit is one fit of a tiny LSTM for about `--fit-s` seconds on the fake NVML library (tests/fake_nvml.py:
the real pynvml binding runs), with UtilizationMonitor's defaults, so its bytes per step and per GPU-second can
be set beside the synthetic runs' (benchmarks/synthetic_run.py, same Recorder and writer on a virtual clock).

Usage:
    python benchmarks/disk_size.py [--steps 100000] [--fit-s 30] [--json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from tensorboard.compat.proto import event_pb2

from rnnmon.format.eventfile import scan_records


def _group(tag: str) -> str:
    if tag == "rnnmon/steps":
        return "steps"
    if tag.startswith(("rnnmon/util/gpu", "rnnmon/stats/gpu")) or (tag.startswith("rnnmon/gpu") and "/" in tag[7:]):
        return "gpu"
    if tag == "rnnmon/gaps":
        return "gaps"
    if tag in ("rnnmon/step_time_ms", "rnnmon/input_wait_fraction", "rnnmon/host_gap_fraction"):
        return "scalars"
    return "other"


def bytes_by_group(run_dir: str) -> dict[str, float]:
    """Bytes of the run's event files per tag group (framing shared in proportion to value size)."""
    sizes: collections.Counter[str] = collections.Counter()
    for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
        for record in scan_records(path).records:
            event = event_pb2.Event.FromString(record)
            values = list(event.summary.value)
            total = sum(v.ByteSize() for v in values)
            if not values or total == 0:
                sizes["other"] += len(record) + 16
                continue
            for value in values:
                sizes[_group(value.tag)] += (len(record) + 16) * value.ByteSize() / total
    return dict(sizes)


def figures(run_dir: str, steps: int, seconds: float, gpus: int) -> dict[str, Any]:
    groups = bytes_by_group(run_dir)
    total = sum(groups.values())
    return {"steps": steps, "seconds": round(seconds, 1), "bytes": int(total),
            "bytes_per_step": round(total / steps, 2),
            "steps_bytes_per_step": round(groups.get("steps", 0) / steps, 2),
            "gpu_bytes_per_gpu_second": round(groups.get("gpu", 0) / (seconds * gpus), 1) if gpus else None,
            "groups": {k: int(v) for k, v in sorted(groups.items())}}


def real_fit(seconds: float) -> dict[str, Any]:
    """One tiny-LSTM fit of about `seconds` on one fake GPU, monitored with the defaults."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    from fake_nvml import FakeGpu, FakeNvmlLib, installed

    from rnnmon import UtilizationMonitor

    x = np.random.default_rng(0).normal(size=(32 * 64, 16, 8)).astype("float32")
    y = x.sum(axis=(1, 2))[:, None]
    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # tracing
    started = time.perf_counter()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # the time of an epoch
    epochs = max(1, round(seconds / (time.perf_counter() - started)))
    logdir = tempfile.mkdtemp(prefix="rnnmon-disk-")
    with installed(FakeNvmlLib([FakeGpu(utilization=lambda t: 20.0 + 70.0 * (int(t * 3) % 2),
                                        pids=[os.getpid()])])):
        started = time.perf_counter()
        model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=[UtilizationMonitor(logdir)])
        elapsed = time.perf_counter() - started
    history = epochs * (len(x) // 32)
    return figures(os.path.join(logdir, "rnnmon"), history, elapsed, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="steps of each synthetic run")
    parser.add_argument("--fit-s", type=float, default=30.0, help="seconds of the real fit")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from synthetic_run import write_run

    results = {}
    for kind in ("gpu", "input"):
        run_dir = os.path.join(tempfile.mkdtemp(prefix="rnnmon-disk-"), kind, "rnnmon")
        written = write_run(run_dir, args.steps, kind)
        results[f"synthetic {kind}"] = figures(run_dir, args.steps, written["virtual_s"], 1 if kind == "gpu" else 0)
    results["real fit"] = real_fit(args.fit_s)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'run':16} {'steps':>8} {'B/step':>7} {'steps B/step':>12} {'GPU B/GPU-s':>11}")
        for name, r in results.items():
            print(f"{name:16} {r['steps']:8d} {r['bytes_per_step']:7.2f} {r['steps_bytes_per_step']:12.2f} "
                  f"{r['gpu_bytes_per_gpu_second'] if r['gpu_bytes_per_gpu_second'] is not None else '-':>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
