"""What reading a run on object storage adds to opening it: the mirror's sync, first (everything downloaded) and
again (nothing changed: one listing), against a real S3-compatible server on 127.0.0.1 (moto's server mode). After
a sync the mirror is a local folder, so the tab and `rnnmon report` then read it as fast as a local run; this
measures what comes before that, and `rnnmon report` on the mirror against the same run read locally.

Usage:
    python benchmarks/remote_open.py WORKDIR [--steps 1000000]     # the run is written once into WORKDIR/local
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from object_stores import ObjectStore
from synthetic_run import write_run

from rnnmon.report import build_report
from rnnmon.storage.mirror import Mirror


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    local = os.path.join(args.workdir, "local", f"steps_{args.steps}")
    if not os.path.isdir(os.path.join(local, "rnnmon")):
        write_run(os.path.join(local, "rnnmon"), args.steps)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(local) for f in fs)
    with ObjectStore("s3") as store:
        os.environ.update(store.env, RNNMON_CACHE_DIR=os.path.join(args.workdir, f"cache-{store.port}"))
        store.make_bucket()
        fs = store.filesystem()
        fs.put(local + "/", store.url("exp").split("://", 1)[1], recursive=True)
        figures: dict[str, float] = {"bytes": size}
        started = time.perf_counter()
        mirror = Mirror(store.url("exp"))
        mirror.sync()
        figures["first_sync_s"] = time.perf_counter() - started
        started = time.perf_counter()
        again = Mirror(store.url("exp"))  # a new process: the manifest is read from disk
        again.sync()
        figures["second_sync_s"], figures["second_sync_downloads"] = time.perf_counter() - started, again.downloaded
        build_report(local)  # a first read warms the imports and the page cache for both timed ones
        started = time.perf_counter()
        build_report(local)
        figures["report_local_s"] = time.perf_counter() - started
        started = time.perf_counter()
        build_report(store.url("exp"))
        figures["report_remote_cached_s"] = time.perf_counter() - started
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}, indent=1))


if __name__ == "__main__":
    main()
