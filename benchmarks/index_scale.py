"""Cold `/timeline` of one long run in a fresh `tensorboard --logdir` (default flags), drawn from its reading index
and read whole, side by side: the TensorBoard Python process's CPU seconds and wall seconds for the first request,
its resident memory when idle and the peak during that request (VmHWM reset before it through
/proc/PID/clear_refs), then a cached request, a zoom to 1% of the run, the first `/runs` (CPU, peak), and with
`--summary` the first `/summary` (from the run's digest where it has an index, see rnnmon.format.digest_read);
with `--live N` then N times a new 100-step chunk (a new segment, as `tab_scale.py --live` writes one) and the
`/summary` after it (the segments are removed afterwards).

Each LOGDIR holds one run (`rnnmon`, as benchmarks/synthetic_run.py writes it: LOGDIR/rnnmon). Modes: "default"
(runs with 4 MiB of event files or more are drawn from their index, shorter ones read whole); "index" (every run
drawn from its index: `--rnnmon_index_from_bytes=0`; a run without one gets it built in memory on this first
request); "whole" (`--rnnmon_index_from_bytes` past the run's size: read whole, as before the index). The
machine's load average is printed beside the figures.

Usage:
    python benchmarks/index_scale.py LOGDIR [LOGDIR ...] [--modes index whole] [--summary] [--live 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_run import write_run
from tab_scale import cpu_s, memory_mb, timed, wait_loaded
from tab_session import tensorboard

POINTS = 1280
FLAGS = {"default": [], "index": ["--rnnmon_index_from_bytes=0"],
         "whole": ["--rnnmon_index_from_bytes=1000000000000000"]}


def live_summaries(url: str, pid: int, run_dir: str, chunks: int) -> list[float]:
    """The server's CPU seconds of `/summary` after each of `chunks` new 100-step chunks, each in its own segment
    (the run's steps go on after its end; the segments and their index folders are removed afterwards)."""
    index_dir = os.path.join(run_dir, "rnnmon-index")
    before = set(os.listdir(run_dir)), set(os.listdir(index_dir))
    out = []
    try:
        for chunk in range(chunks):
            time.sleep(2.5)  # a segment's 100 steps end now: 2 s long, so segments never overlap
            write_run(run_dir, 100, "input", seed=chunk + 1, status="running")
            out.append(round(timed(url, pid, "summary", run="rnnmon")[1], 3))
    finally:
        for name in set(os.listdir(run_dir)) - before[0]:
            os.remove(os.path.join(run_dir, name))
        for name in set(os.listdir(index_dir)) - before[1]:
            shutil.rmtree(os.path.join(index_dir, name))
    return out


def measure(logdir: str, mode: str, with_summary: bool, live: int = 0) -> dict[str, object]:
    run = "rnnmon"
    size = sum(entry.stat().st_size for entry in os.scandir(os.path.join(logdir, run)) if "tfevents" in entry.name)
    with tensorboard(logdir, *FLAGS[mode]) as (url, pid):
        wait_loaded(url, [run], 0)
        settle = cpu_s(pid)
        while True:  # until TensorBoard's own loading is done
            time.sleep(2)
            now = cpu_s(pid)
            if now - settle < 0.05:
                break
            settle = now
        idle = memory_mb(pid)["VmRSS"]
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM starts again from VmRSS
        load = os.getloadavg()[0]
        wall, cpu, body = timed(url, pid, "timeline", run=run, points=POINTS)
        memory = memory_mb(pid)
        cached = [timed(url, pid, "timeline", run=run, points=POINTS)[:2] for _ in range(3)]
        end = body["extent"]["end"]
        zoom = timed(url, pid, "timeline", run=run, points=POINTS, start=end * 0.5, end=end * 0.51)
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        runs = timed(url, pid, "runs")
        runs_peak = memory_mb(pid)["VmHWM"] - idle
        summary = timed(url, pid, "summary", run=run) if with_summary else (0.0, 0.0, None)
        summary_memory = memory_mb(pid)
        live_cpu = live_summaries(url, pid, os.path.join(logdir, run), live) if live else []
    return {"logdir": logdir, "mode": mode, "event_mb": round(size / 2**20, 1), "steps": body["steps"]["total"],
            "cold_cpu_s": round(cpu, 3), "cold_wall_s": round(wall, 3), "idle_mb": idle,
            "peak_above_idle_mb": round(memory["VmHWM"] - idle, 1), "after_above_idle_mb": round(
                memory["VmRSS"] - idle, 1),
            "cached_cpu_s": round(statistics.median(c for _, c in cached), 3),
            "zoom_cpu_s": round(zoom[1], 3), "runs_cpu_s": round(runs[1], 3), "runs_peak_above_idle_mb": round(
                runs_peak, 1), "summary_cpu_s": round(summary[1], 3),
            "peak_above_idle_after_summary_mb": round(summary_memory["VmHWM"] - idle, 1),
            "after_summary_above_idle_mb": round(summary_memory["VmRSS"] - idle, 1), "load": round(load, 2),
            **({"live_summary_cpu_s": live_cpu, "load_after": round(os.getloadavg()[0], 2)} if live else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdirs", nargs="+")
    parser.add_argument("--modes", nargs="+", choices=sorted(FLAGS), default=["index", "whole"])
    parser.add_argument("--summary", action="store_true", help="then the first /summary")
    parser.add_argument("--live", type=int, default=0, help="then /summary after each of N new chunks")
    args = parser.parse_args(argv)
    for logdir in args.logdirs:
        for mode in args.modes:
            print(json.dumps(measure(logdir, mode, args.summary, args.live)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
