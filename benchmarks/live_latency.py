"""From a training step to the rnnmon tab showing it: the real `tensorboard --logdir` (default flags), a real fit
in another process, and the tab open in headless Chromium.

The fit (a tiny LSTM whose input pipeline sleeps 50 ms a batch: ~20 steps a second) writes through
UtilizationMonitor with its defaults. The tab shows the run as it grows; each time the chart changes, the time it
was drawn and the newest time it shows are recorded. Afterwards, each step's end (read back from the run) is
matched with the first drawing that included it: latency = drawn - step end. Steps from the first 15 s are left
out (TensorBoard and the tab start up then).

Usage:
    python benchmarks/live_latency.py [--seconds 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tab_session import open_tab, tensorboard

from rnnmon.format.logdir import read_logdir

SETTLE_S = 15.0
FIT = textwrap.dedent("""
    import os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf, keras, rnnmon

    def slow(batch):
        time.sleep(0.05)
        return batch

    def stage(x, y):
        out = tf.py_function(slow, [x], tf.float32)
        out.set_shape(x.shape)
        return out, y

    x = np.random.default_rng(0).normal(size=(32 * int(sys.argv[2]), 16, 8)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :, :1].mean(axis=1))).batch(32).map(stage)
    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(data, epochs=1, verbose=0, callbacks=[rnnmon.UtilizationMonitor(sys.argv[1])])
""")


def watch(url: str, run: str, fit: subprocess.Popen) -> list[tuple[float, float]]:
    """(drawn at, newest time shown) for every change of the chart while the fit runs."""
    from playwright.sync_api import sync_playwright

    drawings: list[tuple[float, float]] = []
    with sync_playwright() as playwright:
        browser, frame = open_tab(playwright, url)
        frame.wait_for_function(f"() => [...document.querySelectorAll('#rm-run-a option')].some((o) => "
                                f"o.value === {json.dumps(run)})", timeout=120_000)
        frame.select_option("#rm-run-a", run)
        shown = 0.0
        while fit.poll() is None:
            try:
                newest = frame.wait_for_function(
                    f"() => {{ const v = Number(document.getElementById('rm-plot')?.dataset.newest || 0);"
                    f" return v > {shown} ? v : false; }}", timeout=2_000, polling=50).json_value()
            except Exception:  # no change within 2 s (a playwright TimeoutError): look again
                continue
            drawings.append((time.time(), float(newest)))
            shown = float(newest)
        browser.close()
    return drawings


def latencies(step_ends: np.ndarray, drawings: list[tuple[float, float]], since: float) -> np.ndarray:
    drawn_at = np.array([d[0] for d in drawings])
    newest = np.maximum.accumulate(np.array([d[1] for d in drawings]))
    steps = step_ends[(step_ends >= since) & (step_ends <= newest[-1])]
    first = np.searchsorted(newest, steps, side="left")  # the first drawing whose newest time covers the step
    return drawn_at[first] - steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logdir = tempfile.mkdtemp(prefix="rnnmon-live-")
    script = os.path.join(logdir, "fit.py")
    with open(script, "w") as f:
        f.write(FIT)
    with tensorboard(logdir) as (url, _):
        started = time.time()
        fit = subprocess.Popen([sys.executable, script, os.path.join(logdir, "live"), str(int(20 * args.seconds))],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            drawings = watch(url, "live/rnnmon", fit)
        finally:
            fit.wait(timeout=600)
    steps = read_logdir(logdir)["live/rnnmon"].steps
    lag = latencies(np.sort(steps[:, 3]), drawings, started + SETTLE_S)
    result = {"steps_measured": len(lag), "drawings": len(drawings),
              "median_s": round(float(np.median(lag)), 2), "p90_s": round(float(np.percentile(lag, 90)), 2),
              "worst_s": round(float(lag.max()), 2)}
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
