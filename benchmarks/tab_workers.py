"""`/workers` of a job with many workers: the first request, one with nothing changed, and one after a worker grew.

Writes `--workers` worker folders (`job/worker-<i>/rnnmon`, `--chunks` chunks of 5 steps and 12 utilization samples
each, tests/synthetic_runs.py; worker-3 waits 10 ms more per step) into LOGDIR unless they are there, then serves
the plugin over TensorBoard's Python data provider in this process and times `GET /workers` through its WSGI app:
wall seconds and this process's CPU seconds, median of `--repeat` for the unchanged case.

Usage:
    python benchmarks/tab_workers.py LOGDIR [--workers 256] [--chunks 60] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tensorboard_plugin")]

from rnnmon_tensorboard.plugin import RnnmonPlugin  # noqa: E402
from synthetic_runs import write_gpu_run  # noqa: E402
from tensorboard.backend import application  # noqa: E402
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer  # noqa: E402
from tensorboard.plugins import base_plugin  # noqa: E402
from werkzeug import test as werkzeug_test  # noqa: E402

ROUTE = "/data/plugin/rnnmon/workers"


def timed(client: werkzeug_test.Client) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    response = client.get(ROUTE, query_string={"run": "job/worker-0/rnnmon"})
    assert response.status_code == 200, response.get_data(as_text=True)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir")
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    start = time.time() - 3600
    for index in range(args.workers):
        run_dir = os.path.join(args.logdir, "job", f"worker-{index}", "rnnmon")
        if not os.path.isdir(run_dir):
            write_gpu_run(run_dir, args.chunks, start=start, wait_s=0.016 if index == 3 else 0.006)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"rnnmon": 0})
    multiplexer.AddRunsFromDirectory(args.logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, args.logdir)
    plugin = RnnmonPlugin(base_plugin.TBContext(logdir=args.logdir, data_provider=provider))
    client = werkzeug_test.Client(application.TensorBoardWSGI([plugin], data_provider=provider))
    print(f"{args.workers} workers, {args.chunks * 5} steps each; load average {os.getloadavg()[0]:.2f}")
    wall, cpu = timed(client)
    print(f"first request:         {wall:.3f} s wall, {cpu:.3f} s CPU")
    unchanged = [timed(client) for _ in range(args.repeat)]
    wall, cpu = statistics.median(w for w, _ in unchanged), statistics.median(c for _, c in unchanged)
    print(f"nothing changed:       {wall:.3f} s wall, {cpu:.3f} s CPU (median of {args.repeat}; "
          f"worst {max(w for w, _ in unchanged):.3f} s wall)")
    write_gpu_run(os.path.join(args.logdir, "job", "worker-1", "rnnmon"), 2, start=start)  # a worker grows
    multiplexer.Reload()
    wall, cpu = timed(client)
    print(f"one worker changed:    {wall:.3f} s wall, {cpu:.3f} s CPU")


if __name__ == "__main__":
    main()
