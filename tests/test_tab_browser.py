"""The rnnmon tab end to end: `rnnmon demo`, the real `tensorboard` with default flags, headless Chromium.

Screenshots go to artifacts/ (and the demo comparison to docs/tab.png, for the README).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from synthetic_runs import write_gpu_run, write_unreadable_run

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(ROOT, "artifacts")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PLOT = "document.getElementById('rm-plot')"
GPU_RUN = "gpu <img src=x onerror=window.pwned=1>"  # markup in a run name must show as text, never run

LIVE_FIT = textwrap.dedent("""
    import os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf, keras, rnnmon

    def slow(batch):
        time.sleep(0.05)  # a slow input pipeline: about 20 steps per second
        return batch

    def stage(x, y):
        out = tf.py_function(slow, [x], tf.float32)
        out.set_shape(x.shape)
        return out, y

    x = np.random.default_rng(0).normal(size=(32 * 500, 16, 8)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :, :1].mean(axis=1))).batch(32).map(stage)
    model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(data, epochs=1, verbose=0, callbacks=[rnnmon.UtilizationMonitor(sys.argv[1])])
""")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tab")
    subprocess.run([sys.executable, "-m", "rnnmon.cli", "demo", "--logdir", str(root)], check=True,
                   capture_output=True, timeout=180)
    write_gpu_run(str(root / GPU_RUN / "rnnmon"), 40, gpus=2, dip_at=100)
    write_unreadable_run(str(root / "unreadable" / "rnnmon"))
    return root


@pytest.fixture(scope="module")
def tensorboard(logdir):
    with _tensorboard(str(logdir), active=True) as url:
        yield url


@contextlib.contextmanager
def _tensorboard(logdir: str, active: bool):
    """The real `tensorboard` with default flags, once /data/plugins_listing lists rnnmon (as `active`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port),
                               "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while _rnnmon_listing(url) != active:
            assert time.monotonic() < deadline and server.poll() is None, "tensorboard did not list rnnmon"
            time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def _rnnmon_listing(url: str) -> bool | None:
    """Whether rnnmon is listed as active; None while TensorBoard does not answer or does not list it."""
    try:
        with urllib.request.urlopen(f"{url}/data/plugins_listing") as response:
            listing = json.load(response).get("rnnmon")
    except OSError:
        return None
    return None if listing is None else bool(listing["enabled"])


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def tab(browser, tensorboard):
    """The rnnmon tab's frame once it has drawn, with console errors (page and frames) and /timeline requests."""
    page, frame, problems, timelines = _open_tab(browser, tensorboard)
    try:
        frame.wait_for_function(f"() => {PLOT} && {PLOT}.data && {PLOT}.data.length > 0", timeout=30_000)
        yield page, frame, problems, timelines
    finally:
        page.close()


def _open_tab(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1250})
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    timelines: list[str] = []
    page.on("request", lambda request: timelines.append(request.url) if "/rnnmon/timeline" in request.url else None)
    page.goto(f"{url}/#rnnmon")
    page.frame_locator("iframe").locator("#rm-plot").wait_for(state="attached", timeout=30_000)
    return page, next(f for f in page.frames if "plugin_entry.html" in f.url), problems, timelines


def _select(frame, run_a: str, run_b: str = "") -> None:
    frame.select_option("#rm-run-a", run_a)
    frame.select_option("#rm-run-b", run_b)
    count = 2 if run_b else 1
    frame.wait_for_function(
        """([a, b, count]) => {
            const cards = [...document.querySelectorAll('.rm-card')];
            const names = cards.map((card) => card.dataset.run);
            return cards.length === count && names[0] === a && (!b || names[1] === b)
              && cards.every((card) => card.querySelector('.rm-steps, .rm-error'));
        }""", arg=[run_a, run_b, count], timeout=30_000)
    frame.wait_for_timeout(500)  # plotly finishes drawing


def _traces(frame) -> list[dict]:
    return frame.evaluate(f"() => {PLOT}.data.map((t) => ({{name: t.name || '', x: t.xaxis || 'x', n: t.x.length}}))")


def _screenshot(page, name: str) -> None:
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, name))


def test_demo_runs_side_by_side(tab):
    page, frame, problems, _ = tab
    _select(frame, "input_bound/rnnmon", "tuned/rnnmon")
    traces = _traces(frame)
    for name in ("compute", "input wait", "host gap"):
        assert len([t for t in traces if t["name"] == name]) == 2, name  # one per run
    assert any(t["name"] == "idle: input pipeline" and t["n"] > 0 for t in traces)
    assert any(t["name"] == "idle: validation" for t in traces)
    assert not any("utilization" in t["name"] for t in traces)  # the demo runs on the CPU
    annotations = frame.evaluate(f"() => {PLOT}.layout.annotations.map((a) => a.text)")
    assert annotations.count("No GPU seen by NVML: bands are non-compute gaps from step timing") == 2
    cards = frame.locator(".rm-card")
    assert "input-bound" in cards.nth(0).inner_text() and "compute-bound" in cards.nth(1).inner_text()
    assert frame.locator(".rm-steps").first.get_attribute("data-steps") == "256"
    assert "finished" in cards.nth(0).locator(".rm-status").inner_text().lower()
    _screenshot(page, "tab_demo.png")
    docs = os.path.join(ROOT, "docs", "tab.png")  # for the README: down to the end of the tab's content
    bottom = page.locator("iframe").bounding_box()["y"] + frame.evaluate(
        "() => document.querySelector('.rm-app').getBoundingClientRect().bottom")
    viewport = page.viewport_size
    page.screenshot(path=docs, clip={"x": 0, "y": 0, "width": viewport["width"],
                                     "height": min(viewport["height"], bottom)})
    assert os.path.getsize(docs) < 300_000
    assert not problems


def test_zoom_moves_every_subplot_and_refetches(tab):
    page, frame, problems, timelines = tab
    _select(frame, "input_bound/rnnmon", "tuned/rnnmon")
    timelines.clear()
    frame.evaluate(f"() => Plotly.relayout({PLOT}, {{'xaxis.range': [1.0, 2.0]}})")
    frame.wait_for_function(f"() => {PLOT}.dataset.view === '1.000,2.000'", timeout=10_000)
    ranges = frame.evaluate(f"""() => Object.entries({PLOT}._fullLayout)
        .filter(([key]) => /^xaxis\\d*$/.test(key)).map(([, axis]) => axis.range)""")
    assert len(ranges) == 6 and all(r == [1.0, 2.0] for r in ranges)  # 3 rows x 2 runs
    assert len([u for u in timelines if "start=1.0000" in u and "end=2.0000" in u]) == 2
    _screenshot(page, "tab_zoomed.png")
    frame.click("text=Reset zoom")
    frame.wait_for_function(f"() => {PLOT}.dataset.view === 'all'", timeout=10_000)
    assert not problems


def test_gpu_run_and_an_unreadable_run(tab):
    page, frame, problems, _ = tab
    _select(frame, f"{GPU_RUN}/rnnmon", "unreadable/rnnmon")
    names = {t["name"] for t in _traces(frame)}
    assert {"GPU 0 utilization", "GPU 1 utilization", "GPU 0 SM activity", "idle: input pipeline"} <= names
    assert frame.evaluate(f"() => Math.min(...{PLOT}.data.find((t) => t.name === 'GPU 0 utilization').y)") == 0
    error = frame.locator(".rm-card").nth(1).locator(".rm-error")
    assert "unreadable rnnmon data" in error.inner_text()
    assert frame.locator(".rm-card").nth(0).locator(".rm-error").count() == 0
    # names from the data are text: in the page, in the selector and in plotly's labels
    assert frame.locator(".rm-card .rm-run").first.inner_text() == GPU_RUN
    assert frame.locator("#rm-run-a option:checked").inner_text() == GPU_RUN
    assert frame.locator(".rm-plot img").count() == 0 and frame.evaluate("() => window.pwned") is None
    hover = frame.evaluate(f"() => {PLOT}.data.find((t) => t.name === 'GPU 0 utilization').hovertemplate")
    assert "Fake GPU &lt;0&gt;" in hover
    _screenshot(page, "tab_gpu_and_error.png")
    assert not [p for p in problems if "500" not in p]  # the unreadable run's 500 answer is expected


def test_live_run_updates_without_reload(tab, logdir, tmp_path):
    page, frame, problems, _ = tab
    script = tmp_path / "live_fit.py"
    script.write_text(LIVE_FIT)
    fit = subprocess.Popen([sys.executable, str(script), str(logdir / "live")], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        frame.evaluate("() => { window.rnnmonNoReload = true; }")
        frame.wait_for_function("() => [...document.querySelectorAll('#rm-run-a option')]"
                                ".some((o) => o.value === 'live/rnnmon')", timeout=40_000)
        _select(frame, "live/rnnmon")
        steps = frame.locator(".rm-steps")
        lags = []
        for _ in range(3):  # three updates, each within 10 s of the newest step it shows
            shown = int(steps.get_attribute("data-steps"))
            frame.wait_for_function(f"() => Number(document.querySelector('.rm-steps').dataset.steps) > {shown}",
                                    timeout=15_000)
            lags.append(time.time() - float(frame.evaluate(f"() => {PLOT}.dataset.newest")))
        print("live lags (s):", [round(lag, 1) for lag in lags])
        assert max(lags) < 10.0
        assert frame.locator(".rm-status").inner_text().lower().endswith("live")
        assert frame.evaluate("() => window.rnnmonNoReload") is True
        _screenshot(page, "tab_live.png")
    finally:
        fit.terminate()
        fit.wait(timeout=30)
    assert not problems


def test_empty_logdir_explains_how_to_add_the_callback(browser, tmp_path):
    with _tensorboard(str(tmp_path), active=False) as url:
        page, frame, problems, _ = _open_tab(browser, url)
        try:
            message = frame.locator(".rm-message")
            message.wait_for(state="visible", timeout=30_000)
            assert "No rnnmon data" in message.inner_text()
            assert "rnnmon.UtilizationMonitor(" in message.locator("pre").inner_text()
            assert frame.locator(".rm-controls").is_hidden()
            _screenshot(page, "tab_empty.png")
            assert not problems
        finally:
            page.close()
