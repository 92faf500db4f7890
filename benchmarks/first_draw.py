"""The rnnmon tab's first drawing of a long run beside TensorBoard's Time Series chart of a scalar as long, each in a
fresh `tensorboard --logdir` (default flags) and a fresh headless Chromium page.

rnnmon: LOGDIR holds one run (benchmarks/synthetic_run.py: LOGDIR/rnnmon); timed from opening `/#rnnmon` to the tab's
chart and run card drawn (its first run: the card's steps shown, the plot holding its traces). The peer: PEERDIR
holds one scalar of as many points (`epoch_loss` at every step, as Keras' `TensorBoard(update_freq="batch")` logs a
batch-level loss; written here with rnnmon's standard-scalar writer if missing); timed from opening `/#timeseries` to
its scalar card's data answered by TensorBoard (`/timeSeries`) and two frames drawn after it (the chart is a WebGL
canvas: its pixels cannot be read back). Both start once TensorBoard lists its plugins, so each includes
TensorBoard loading the run. Repeated `--repeats` times, alternating; the load average is printed beside them.

Usage:
    python benchmarks/first_draw.py LOGDIR PEERDIR [--steps 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tab_session import CHROMIUM, CHROMIUM_ARGS, tensorboard

_FRAMES = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


def write_peer(peer_dir: str, steps: int) -> None:
    """A scalar of `steps` points, one event each, flushed every 1,000 as a writer would."""
    from rnnmon.format.writer import SummaryWriter

    writer = SummaryWriter(os.path.join(peer_dir, "train"))
    for step in range(steps):
        writer.scalar("epoch_loss", 1.0 / (1 + step % 977), step)
        if step % 1000 == 999:
            writer.flush()
    writer.close()


def rnnmon_drawn(logdir: str) -> tuple[float, float]:
    from playwright.sync_api import sync_playwright

    with tensorboard(logdir) as (url, _), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1250})
        start = time.perf_counter()
        page.goto(f"{url}/#rnnmon")
        page.frame_locator("iframe").locator("#rm-run-a").wait_for(state="attached", timeout=120_000)
        frame = next(f for f in page.frames if "plugin_entry.html" in f.url)
        frame.wait_for_function(
            """() => { const card = document.querySelector('.rm-card');
                       const plot = document.getElementById('rm-plot');
                       return card && card.querySelector('.rm-steps') && plot
                         && (plot.querySelector('canvas.rm-preview[data-traces]') || plot._fullLayout); }""",
            timeout=120_000, polling="raf")
        drawn = time.perf_counter() - start
        frame.wait_for_function(
            "() => { const plot = document.getElementById('rm-plot'); return plot.data?.length && plot._fullLayout; }",
            timeout=120_000, polling="raf")
        interactive = time.perf_counter() - start
        browser.close()
    return drawn, interactive


def peer_drawn(peer_dir: str) -> float:
    from playwright.sync_api import sync_playwright

    with tensorboard(peer_dir) as (url, _), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1250})
        start = time.perf_counter()
        with page.expect_response(lambda r: "timeSeries" in r.url and "epoch_loss" in (r.request.post_data or ""),
                                  timeout=120_000) as answer:
            page.goto(f"{url}/#timeseries")
        answer.value.finished()
        page.wait_for_selector("scalar-card line-chart canvas", timeout=120_000)
        page.evaluate(_FRAMES)
        drawn = time.perf_counter() - start
        browser.close()
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("peerdir")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.peerdir):
        print(f"writing a {args.steps}-point scalar into {args.peerdir} ...", file=sys.stderr)
        write_peer(args.peerdir, args.steps)
    times: dict[str, list[float]] = {"rnnmon tab": [], "rnnmon tab, plotly's chart": [], "Time Series chart": []}
    for _ in range(args.repeats):
        drawn, interactive = rnnmon_drawn(args.logdir)
        times["rnnmon tab"].append(drawn)
        times["rnnmon tab, plotly's chart"].append(interactive)
        times["Time Series chart"].append(peer_drawn(args.peerdir))
    print(json.dumps({**{name: {"median_s": round(statistics.median(v), 2), "all_s": [round(x, 2) for x in v]}
                         for name, v in times.items()},
                      "load average": [round(v, 2) for v in os.getloadavg()]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
