"""The real `tensorboard --logdir` with default flags, and the rnnmon tab opened in it by headless Chromium: what
the tab benchmarks (tab_scale.py, live_latency.py) share.

Example:
    >>> with tensorboard("runs") as (url, pid), sync_playwright() as playwright:
    ...     browser, frame = open_tab(playwright, url)
    ...     frame.select_option("#rm-run-a", "exp1/rnnmon")
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


@contextlib.contextmanager
def tensorboard(logdir: str, *flags: str) -> Iterator[tuple[str, int]]:
    """`tensorboard --logdir` (default flags, plus `flags`); yields its URL and PID once rnnmon's tab is listed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port),
                               "--host", "127.0.0.1", *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    """The JSON answer of `url + path` with `params` as its query."""
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=120) as response:
        return json.load(response)


def open_tab(playwright: Any, url: str) -> tuple[Any, Any]:
    """Headless Chromium on TensorBoard's rnnmon tab: (browser, the tab's frame), with TensorBoard's own reload off."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1250})
    page.goto(f"{url}/#rnnmon")
    page.frame_locator("iframe").locator("#rm-run-a").wait_for(state="attached", timeout=60_000)
    frame = next(f for f in page.frames if "plugin_entry.html" in f.url)
    frame.evaluate("() => { window.rnnmonNoReload = true; }")
    return browser, frame
