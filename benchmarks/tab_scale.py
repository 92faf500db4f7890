"""The rnnmon tab on long runs, through the real `tensorboard --logdir` (default flags) and headless Chromium.

The log directory holds `--runs` input-bound runs of `--steps` steps (a gap at almost every step; copies of one
run written by benchmarks/synthetic_run.py) and one GPU run of the same length; missing ones are written first
(minutes for 1M steps: keep LOGDIR and reuse it). Measured, each as wall seconds and as the TensorBoard Python
process's CPU seconds (user + system, from /proc: what a loaded machine stretches least):
- `/timeline` at the tab's width (1280 points): the run's first request, cached (median of 5), and a zoom. The
  first request is "read ahead" where `/runs` (polled while TensorBoard loads the runs) had the run read in the
  background (the first listed, gpu, which the tab shows first, and the newest, input_0: the copies tie, and the
  budget of 200 MB takes two), "cold" for the others;
- `/summary`: cold (after the timeline) and cached;
- memory: the TensorBoard Python process's RSS when idle (runs loaded, no route asked), 10 s after the first
  `/runs` (what it read ahead) and after every run's timeline and summary were served (VmRSS and VmHWM from /proc);
- with `--live S` (default 30): a live run (input_0) that gets a 100-step chunk every 2 s (each in its own event
  file) for S seconds; each time `/runs` shows new data, `/timeline` is timed right away. The first one reads the
  run whole (it was finished until then); the others are "after a reload";
- with `--browser`: the tab drawn in Chromium (from selecting a run to its chart), for a run the routes had
  served, for one they had not (input_5: not read ahead) and for one only read ahead (input_0).
The machine's load average is printed beside the figures.

Usage:
    python benchmarks/tab_scale.py LOGDIR [--steps 1000000] [--runs 10] [--live 30] [--browser] [--json]
    python benchmarks/tab_scale.py LOGDIR -- --load_fast=false      # flags after -- go to tensorboard
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_run import write_run
from tab_session import get, open_tab, tensorboard

POINTS = 1280
READ_AHEAD_WAIT_S = 10.0  # after the first /runs: time for the two runs it reads ahead (~1.5 s CPU each)
READ_AHEAD_CPU_S = 0.2  # a first /timeline under this server CPU found the index built (a read costs ~1 s)
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def prepare(logdir: str, steps: int, runs: int) -> list[str]:
    """Write the runs that are missing; returns the run names."""
    first = os.path.join(logdir, "input_0", "rnnmon")
    if not os.path.isdir(first):
        print("writing", write_run(first, steps, "input"), file=sys.stderr)
    for index in range(1, runs):
        copy = os.path.join(logdir, f"input_{index}", "rnnmon")
        if not os.path.isdir(copy):
            shutil.copytree(first, copy)
    gpu = os.path.join(logdir, "gpu", "rnnmon")
    if not os.path.isdir(gpu):
        print("writing", write_run(gpu, steps, "gpu"), file=sys.stderr)
    return [f"input_{index}/rnnmon" for index in range(runs)] + ["gpu/rnnmon"]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def timed(url: str, pid: int, route: str, **params: Any) -> tuple[float, float, Any]:
    """(wall seconds, the server's CPU seconds, answer) of one request."""
    cpu, start = cpu_s(pid), time.perf_counter()
    body = get(url, f"/data/plugin/rnnmon/{route}", **params)
    return time.perf_counter() - start, cpu_s(pid) - cpu, body


def memory_mb(pid: int) -> dict[str, float]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = round(int(value.split()[0]) / 1024, 1)
    return fields


def wait_loaded(url: str, runs: list[str], steps: int) -> None:
    """Until TensorBoard lists every run (its loader reads the files after it starts); asks TensorBoard's own run
    list, not rnnmon's `/runs`, which would start reading runs ahead."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            listed = set(get(url, "/data/runs"))
            if set(runs) <= listed:
                return
        time.sleep(1)
    raise RuntimeError("the runs were not all loaded")


def routes(url: str, pid: int, runs: list[str]) -> dict[str, Any]:
    out: dict[str, list[float]] = {}

    def note(name: str, wall_s: float, cpu: float) -> None:
        out.setdefault(f"{name}_s", []).append(wall_s)
        out.setdefault(f"{name}_cpu_s", []).append(cpu)

    for run in runs:
        wall_s, cpu, body = timed(url, pid, "timeline", run=run, points=POINTS)
        ahead = cpu < READ_AHEAD_CPU_S  # /runs had it read in the background: the index was there
        note("timeline_read_ahead" if ahead else "timeline_cold", wall_s, cpu)
        cached = [timed(url, pid, "timeline", run=run, points=POINTS)[:2] for _ in range(5)]
        note("timeline_cached", statistics.median(c[0] for c in cached), statistics.median(c[1] for c in cached))
        end = body["extent"]["end"]
        note("zoom", *timed(url, pid, "timeline", run=run, points=POINTS, start=end / 3, end=end / 3 + 60)[:2])
        note("summary_cold", *timed(url, pid, "summary", run=run)[:2])
        cached = [timed(url, pid, "summary", run=run)[:2] for _ in range(5)]
        note("summary_cached", statistics.median(c[0] for c in cached), statistics.median(c[1] for c in cached))
        print(f"{run}: {body['steps']['total']} steps, timeline {'read ahead' if ahead else 'cold'} {wall_s:.3f} s "
              f"({cpu:.2f} s CPU), cached {out['timeline_cached_s'][-1]:.3f} s, "
              f"summary cold {out['summary_cold_s'][-1]:.3f} s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    return {key: {"median": round(statistics.median(v), 3), "max": round(max(v), 3)} for key, v in out.items()}


def browser_draw(url: str, runs: list[str]) -> dict[str, float]:
    """Seconds from selecting each run in the tab to its chart and card being drawn."""
    from playwright.sync_api import sync_playwright

    drawn = {}
    with sync_playwright() as playwright:
        browser, frame = open_tab(playwright, url)
        frame.wait_for_function("() => document.querySelectorAll('#rm-run-a option').length > 1", timeout=60_000)
        for run in runs:
            start = time.perf_counter()
            frame.select_option("#rm-run-a", run)
            frame.wait_for_function(
                """(run) => { const card = document.querySelector('.rm-card');
                              const plot = document.getElementById('rm-plot');
                              return card && card.dataset.run === run && card.querySelector('.rm-steps')
                                && plot && plot.data && plot.data.length > 0 && plot._fullLayout; }""",
                arg=run, timeout=60_000)
            drawn[run] = round(time.perf_counter() - start, 3)
        browser.close()
    return drawn


def live_reloads(url: str, pid: int, logdir: str, seconds: float) -> dict[str, Any]:
    """`/timeline` right after each change to a live 1M-step run that gets a chunk every 2 s is seen."""
    run_dir = os.path.join(logdir, "input_0", "rnnmon")
    stop = threading.Event()

    def append() -> None:
        seed = 1
        while not stop.wait(2.0):
            write_run(run_dir, 100, "input", seed=seed, status="running")
            seed += 1

    before = set(os.listdir(run_dir))
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    times: list[tuple[float, float]] = []
    last = None
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            runs = {run["run"]: run for run in get(url, "/data/plugin/rnnmon/runs")["runs"]}
            written = runs["input_0/rnnmon"]["last_write"]
            if last is not None and written != last:
                times.append(timed(url, pid, "timeline", run="input_0/rnnmon", points=POINTS)[:2])
                print(f"after a reload: timeline {times[-1][0]:.3f} s ({times[-1][1]:.2f} s CPU), "
                      f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
            last = written
            time.sleep(0.2)
    finally:
        stop.set()
        writer.join()
        for name in set(os.listdir(run_dir)) - before:  # leave the run as it was, for the next measurement
            os.remove(os.path.join(run_dir, name))
    reloads = times[1:]  # the first read the run whole: it was finished until the writer started
    return {"first_s": round(times[0][0], 3) if times else None, "reloads": len(reloads),
            **{f"{name}_{unit}": round(pick([t[i] for t in reloads]), 3) if reloads else None
               for i, unit in enumerate(("s", "cpu_s")) for name, pick in (("median", statistics.median),
                                                                           ("max", max))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--browser", action="store_true")
    parser.add_argument("--live", type=float, default=30.0, help="seconds of a live run (0: none)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("flags", nargs="*", help="after --: flags for tensorboard (e.g. --load_fast=false)")
    args = parser.parse_args()
    runs = prepare(args.logdir, args.steps, args.runs)
    result: dict[str, Any] = {"steps": args.steps, "runs": len(runs), "flags": args.flags,
                              "load_before": [round(v, 1) for v in os.getloadavg()]}
    with tensorboard(args.logdir, *args.flags) as (url, pid):
        wait_loaded(url, runs, args.steps)
        time.sleep(5)  # let the loader settle
        result["idle_mb"] = memory_mb(pid)
        get(url, "/data/plugin/rnnmon/runs")  # what the tab asks first: runs are read ahead in the background
        time.sleep(READ_AHEAD_WAIT_S)
        result["after_read_ahead_mb"] = memory_mb(pid)
        if args.browser:  # before any route served them: a run not read ahead, then one /runs read ahead
            drawn = browser_draw(url, ["input_5/rnnmon", "input_0/rnnmon"])
            result["browser_cold_s"], result["browser_read_ahead_s"] = drawn["input_5/rnnmon"], drawn["input_0/rnnmon"]
        result["routes"] = routes(url, pid, runs)
        result["after_routes_mb"] = memory_mb(pid)
        result["above_idle_mb"] = round(result["after_routes_mb"]["VmRSS"] - result["idle_mb"]["VmRSS"], 1)
        if args.browser:
            result["browser_cached_s"] = browser_draw(url, runs[-2:])  # the newest served: still in the cache
        if args.live:
            result["live"] = live_reloads(url, pid, args.logdir, args.live)
        result["load_after"] = [round(v, 1) for v in os.getloadavg()]
    print(json.dumps(result, indent=2 if not args.json else None))


if __name__ == "__main__":
    main()
