"""The rnnmon tab on long runs, through the real `tensorboard --logdir` (default flags) and headless Chromium.

The log directory holds `--runs` input-bound runs of `--steps` steps (a gap at almost every step; copies of one
run written by benchmarks/synthetic_run.py) and one GPU run of the same length. Measured:
- `/timeline` at the tab's width (1280 points): cold (the run's first request), cached (median of 5), and a zoom;
- `/summary`: cold (after the timeline) and cached;
- memory: the TensorBoard Python process's RSS when idle (runs loaded, no route asked) and after every run's
  timeline and summary were served (VmRSS and VmHWM from /proc);
- with `--browser`: the tab drawn in Chromium (from selecting a run to its chart), for a run the routes had
  served and for one they had not;
- with `--live S`: a live run that gets a 100-step chunk every 2 s (each in its own event file) for S seconds;
  each time TensorBoard's reload shows new data, `/timeline` is timed right away.

Usage:
    python benchmarks/tab_scale.py LOGDIR [--steps 1000000] [--runs 10] [--browser] [--live 40] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_run import write_run

POINTS = 1280
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


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


@contextlib.contextmanager
def tensorboard(logdir: str) -> Iterator[tuple[str, int]]:
    """`tensorboard --logdir` with default flags; yields its URL and PID once rnnmon's tab is listed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port),
                               "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError, ValueError):
                if "rnnmon" in get(url, "/data/plugins_listing"):
                    break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("tensorboard did not list rnnmon")
            time.sleep(0.5)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(timeout=30)


def get(url: str, path: str, **params: Any) -> Any:
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=120) as response:
        return json.load(response)


def timed(url: str, route: str, **params: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    body = get(url, f"/data/plugin/rnnmon/{route}", **params)
    return time.perf_counter() - start, body


def memory_mb(pid: int) -> dict[str, float]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = round(int(value.split()[0]) / 1024, 1)
    return fields


def wait_loaded(url: str, runs: list[str], steps: int) -> None:
    """Until TensorBoard lists every run (its loader reads the files after it starts)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            listed = {run["run"] for run in get(url, "/data/plugin/rnnmon/runs")["runs"]}
            if set(runs) <= listed:
                return
        time.sleep(1)
    raise RuntimeError("the runs were not all loaded")


def routes(url: str, runs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"timeline_cold_s": [], "timeline_cached_s": [], "zoom_s": [], "summary_cold_s": [],
                           "summary_cached_s": []}
    for run in runs:
        seconds, body = timed(url, "timeline", run=run, points=POINTS)
        out["timeline_cold_s"].append(seconds)
        steps = body["steps"]["total"]
        out["timeline_cached_s"].append(statistics.median(timed(url, "timeline", run=run, points=POINTS)[0]
                                                          for _ in range(5)))
        end = body["extent"]["end"]
        out["zoom_s"].append(timed(url, "timeline", run=run, points=POINTS, start=end / 3, end=end / 3 + 60)[0])
        out["summary_cold_s"].append(timed(url, "summary", run=run)[0])
        out["summary_cached_s"].append(statistics.median(timed(url, "summary", run=run)[0] for _ in range(5)))
        print(f"{run}: {steps} steps, timeline cold {out['timeline_cold_s'][-1]:.3f} s, "
              f"cached {out['timeline_cached_s'][-1]:.3f} s, summary cold {out['summary_cold_s'][-1]:.3f} s",
              file=sys.stderr)
    return {key: {"median": round(statistics.median(v), 3), "max": round(max(v), 3)} for key, v in out.items()}


def browser_draw(url: str, runs: list[str]) -> dict[str, float]:
    """Seconds from selecting each run in the tab to its chart and card being drawn."""
    from playwright.sync_api import sync_playwright

    drawn = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1250})
        page.goto(f"{url}/#rnnmon")
        page.frame_locator("iframe").locator("#rm-run-a").wait_for(state="attached", timeout=60_000)
        frame = next(f for f in page.frames if "plugin_entry.html" in f.url)
        frame.evaluate("() => { window.rnnmonNoReload = true; }")
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


def live_reloads(url: str, logdir: str, seconds: float) -> dict[str, Any]:
    """`/timeline` right after each TensorBoard reload of a live 1M-step run that gets a chunk every 2 s."""
    run_dir = os.path.join(logdir, "input_0", "rnnmon")
    stop = threading.Event()

    def append() -> None:
        seed = 1
        while not stop.wait(2.0):
            write_run(run_dir, 100, "input", seed=seed, status="running")
            seed += 1

    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    times, last = [], None
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            runs = {run["run"]: run for run in get(url, "/data/plugin/rnnmon/runs")["runs"]}
            written = runs["input_0/rnnmon"]["last_write"]
            if last is not None and written != last:
                times.append(timed(url, "timeline", run="input_0/rnnmon", points=POINTS)[0])
                print(f"after a reload: timeline {times[-1]:.3f} s", file=sys.stderr)
            last = written
            time.sleep(0.2)
    finally:
        stop.set()
        writer.join()
    return {"reloads": len(times), "median_s": round(statistics.median(times), 3) if times else None,
            "max_s": round(max(times), 3) if times else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--browser", action="store_true")
    parser.add_argument("--live", type=float, default=0.0, help="seconds of a live run (0: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = prepare(args.logdir, args.steps, args.runs)
    result: dict[str, Any] = {"steps": args.steps, "runs": len(runs)}
    with tensorboard(args.logdir) as (url, pid):
        wait_loaded(url, runs, args.steps)
        time.sleep(5)  # let the loader settle
        result["idle_mb"] = memory_mb(pid)
        if args.browser:  # the GPU run first, before any route served it: a cold draw
            result["browser_cold_s"] = browser_draw(url, ["gpu/rnnmon"])
        result["routes"] = routes(url, runs)
        result["after_routes_mb"] = memory_mb(pid)
        result["above_idle_mb"] = round(result["after_routes_mb"]["VmRSS"] - result["idle_mb"]["VmRSS"], 1)
        if args.browser:
            result["browser_cached_s"] = browser_draw(url, runs[-2:])  # the newest served: still in the cache
        if args.live:
            result["live"] = live_reloads(url, args.logdir, args.live)
    print(json.dumps(result, indent=2 if not args.json else None))


if __name__ == "__main__":
    main()
