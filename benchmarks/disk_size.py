"""Bytes on disk per step and per GPU-second: synthetic runs and a real fit, tag by tag.

Each event's bytes (its TFRecord framing included) are shared among its values in proportion to their size,
then summed per group of tags:
- `steps`: `rnnmon/steps`, per step;
- `gpu`: `rnnmon/util/gpu*`, `rnnmon/stats/gpu*` and the `rnnmon/gpu*/` scalars, per GPU-second;
- `gaps`, `scalars` (the run-wide Scalars-tab means), `other` (host, phases, documents, file header).

The reading index (`rnnmon-index/`) counts too, each file in the group of its series (`dir.steps`, `steps.L*`:
steps; `util*`, `sm*`: gpu; `gaps.*`: gaps; phases and `dir.docs`: other), and the digest in a group of its own, so
`bytes_per_step` is everything a run leaves on disk; `events`, `index` and `digest` split it.

The real fit is one fit of a tiny LSTM, stopped after `--fit-s` seconds of steps, on the fake NVML library
(tests/fake_nvml.py: the real pynvml binding runs), with UtilizationMonitor's defaults, so its bytes per step and per
GPU-second can be set beside the synthetic runs' (benchmarks/synthetic_run.py, same Recorder and writer on a
virtual clock).

Usage:
    python benchmarks/disk_size.py [--steps 100000] [--fit-s 30] [--runs gpu,input,fit] [--json]
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


def _index_group(name: str) -> str:
    if name == "digest":
        return "digest"
    series = name[4:] if name.startswith("dir.") else name.rsplit(".L", 1)[0]
    if series == "steps":
        return "steps"
    if series.startswith(("util", "sm")):
        return "gpu"
    return "gaps" if series.startswith("gaps.") else "other"


def index_bytes_by_group(run_dir: str) -> dict[str, float]:
    """Bytes of the run's reading index and digest (`rnnmon-index/`) per tag group; the digest is its own group."""
    sizes: collections.Counter[str] = collections.Counter()
    for path in glob.glob(os.path.join(run_dir, "rnnmon-index", "*", "*")):
        sizes[_index_group(os.path.basename(path))] += os.path.getsize(path)
    return dict(sizes)


def figures(run_dir: str, steps: int, seconds: float, gpus: int) -> dict[str, Any]:
    events, index = bytes_by_group(run_dir), index_bytes_by_group(run_dir)
    groups = collections.Counter(events)
    groups.update(index)
    total = sum(groups.values())

    def per_step(value: float) -> float:
        return round(value / steps, 2)

    return {"steps": steps, "seconds": round(seconds, 1), "bytes": int(total),
            "bytes_per_step": per_step(total), "events_bytes_per_step": per_step(sum(events.values())),
            "index_bytes_per_step": per_step(sum(index.values()) - index.get("digest", 0)),
            "digest_bytes_per_step": per_step(index.get("digest", 0)),
            "steps_bytes_per_step": per_step(groups.get("steps", 0)),
            "gpu_bytes_per_gpu_second": round(groups.get("gpu", 0) / (seconds * gpus), 1) if gpus else None,
            "groups": {k: int(v) for k, v in sorted(groups.items())},
            "event_groups": {k: int(v) for k, v in sorted(events.items())},
            "index_groups": {k: int(v) for k, v in sorted(index.items())}}


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

    class StopAfter(keras.callbacks.Callback):
        """Ends the fit after `seconds` of steps, whatever the machine's load (a fit of whole epochs did not)."""

        steps = 0

        def on_train_begin(self, logs: Any = None) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps += 1
            if time.perf_counter() - self.started >= seconds:
                self.model.stop_training = True

    logdir = tempfile.mkdtemp(prefix="rnnmon-disk-")
    stop = StopAfter()
    with installed(FakeNvmlLib([FakeGpu(utilization=lambda t: 20.0 + 70.0 * (int(t * 3) % 2),
                                        pids=[os.getpid()])])):
        started = time.perf_counter()
        model.fit(x, y, batch_size=32, epochs=10_000, verbose=0, callbacks=[UtilizationMonitor(logdir), stop])
        elapsed = time.perf_counter() - started
    return figures(os.path.join(logdir, "rnnmon"), stop.steps, elapsed, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="steps of each synthetic run")
    parser.add_argument("--fit-s", type=float, default=30.0, help="seconds of the real fit")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", default="gpu,input,fit", help="which runs: gpu, input (synthetic), fit (real)")
    args = parser.parse_args(argv)
    from synthetic_run import write_run

    results = {}
    runs = args.runs.split(",")
    for kind in ("gpu", "input"):
        if kind in runs:
            run_dir = os.path.join(tempfile.mkdtemp(prefix="rnnmon-disk-"), kind, "rnnmon")
            written = write_run(run_dir, args.steps, kind)
            results[f"synthetic {kind}"] = figures(run_dir, args.steps, written["virtual_s"],
                                                   1 if kind == "gpu" else 0)
    if "fit" in runs:
        results["real fit"] = real_fit(args.fit_s)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'run':16} {'steps':>8} {'B/step':>7} {'events':>7} {'index':>6} {'digest':>6} "
              f"{'steps B/step':>12} {'GPU B/GPU-s':>11}")
        for name, r in results.items():
            gpu = r["gpu_bytes_per_gpu_second"]
            print(f"{name:16} {r['steps']:8d} {r['bytes_per_step']:7.2f} {r['events_bytes_per_step']:7.2f} "
                  f"{r['index_bytes_per_step']:6.2f} {r['digest_bytes_per_step']:6.2f} "
                  f"{r['steps_bytes_per_step']:12.2f} {gpu if gpu is not None else '-':>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
