"""Which plotly.js the tab loads: npm's partial bundle `plotly.js-cartesian-dist-min` (scatter, bar, heatmap: all the
tab draws; 1.5 MB, parsed and run in about a third of the full bundle's time) when it was fetched next to this
module, else the full bundle (4.8 MB) of the installed `plotly` Python package. The partial bundle is never shipped:
fetch it once, at the full bundle's version, with

    python -m rnnmon_tensorboard.plotly_bundle

(.ci/setup does). The download is checked against the npm registry's sha512 before it is kept, and kept gzipped
too, so that a fresh TensorBoard's first request does not pay the compression (~0.05 s).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import tarfile
import urllib.request

PACKAGE = "plotly.js-cartesian-dist-min"
VENDOR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor")
PARTIAL = "plotly-cartesian.min.js"


def full_bundle() -> str | None:
    """The path of the `plotly` package's plotly.min.js; None when plotly is not installed."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "package_data", "plotly.min.js")


def bundle_path(vendor_dir: str = VENDOR_DIR) -> str | None:
    """The bundle to serve: the partial one in `vendor_dir` when it is there, else the full one (None: neither)."""
    partial = os.path.join(vendor_dir, PARTIAL)
    return partial if os.path.isfile(partial) else full_bundle()


def gzipped(vendor_dir: str = VENDOR_DIR) -> bytes | None:
    """The bundle to serve, gzipped: the partial one as fetched, else the full one compressed now (None: neither)."""
    path = bundle_path(vendor_dir)
    if path is None:
        return None
    if os.path.isfile(f"{path}.gz"):
        with open(f"{path}.gz", "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return gzip.compress(f.read(), compresslevel=6, mtime=0)


def version(path: str) -> str:
    """The plotly.js version in a bundle's header: `* plotly.js v4.1.1`, `* plotly.js (cartesian - minified) v4.1.1`."""
    with open(path, "rb") as f:
        found = re.search(rb"plotly\.js[^\n]* v(\d+\.\d+\.\d+)", f.read(512))
    if not found:
        raise ValueError(f"{path}: no plotly.js version in its header")
    return found.group(1).decode()


def fetch(vendor_dir: str = VENDOR_DIR, registry: str = "https://registry.npmjs.org") -> str:
    """Downloads the partial bundle at the full bundle's version into `vendor_dir`; returns its path."""
    full = full_bundle()
    if full is None:
        raise RuntimeError("The plotly package is not installed: pip install plotly")
    wanted = version(full)
    with urllib.request.urlopen(f"{registry}/{PACKAGE}/{wanted}", timeout=60) as answer:
        dist = json.load(answer)["dist"]
    with urllib.request.urlopen(dist["tarball"], timeout=120) as answer:
        tarball = answer.read()
    algorithm, digest = dist["integrity"].split("-", 1)
    if algorithm != "sha512" or hashlib.sha512(tarball).digest() != base64.b64decode(digest):
        raise RuntimeError(f"{dist['tarball']} does not match the registry's {algorithm} digest")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        member = archive.extractfile(f"package/{PARTIAL}")
        data = member.read() if member else b""
    if not re.search(rb"plotly\.js[^\n]* v" + re.escape(wanted.encode()), data[:512]):
        raise RuntimeError(f"{PACKAGE} {wanted} holds another plotly.js version")
    os.makedirs(vendor_dir, exist_ok=True)
    path = os.path.join(vendor_dir, PARTIAL)
    for name, content in ((f"{path}.gz", gzip.compress(data, compresslevel=9, mtime=0)), (path, data)):
        with open(f"{name}.tmp", "wb") as f:
            f.write(content)
        os.replace(f"{name}.tmp", name)  # the .js last: it marks the bundle fetched, and the .gz is what is served
    return path


if __name__ == "__main__":
    print(fetch())
