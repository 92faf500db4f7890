"""How long `rnnmon report --json` takes, and its peak memory, on synthetic runs of 10k and 1M steps (`--steps`).

Each report runs in a fresh interpreter (`python -m rnnmon.cli report DIR --json`), as a user runs it; the
time is the subprocess's wall time (interpreter start included), with its CPU time beside it because a loaded
machine stretches wall time (the load average is printed with the results); peak memory is the child's maximum
resident set size. A first, unmeasured report per run writes rnnmon's bytecode (as installing it does) and warms
the page cache. The runs come from benchmarks/synthetic_run.py and are kept in `--cache` between invocations (a
1M-step run takes minutes to write).

Usage:
    python benchmarks/report_speed.py [--cache /tmp/rnnmon-report-runs] [--repeats 3] [--kinds input gpu]
        [--steps 10000 1000000 10000000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_CHILD = ("import json, resource, sys; from rnnmon.cli import main; main(['report', sys.argv[1], '--json']); "
          "usage = resource.getrusage(resource.RUSAGE_SELF); "
          "print(json.dumps({'peak_mb': usage.ru_maxrss / 1024, 'cpu_s': usage.ru_utime + usage.ru_stime, "
          "'tensorflow': 'tensorflow' in sys.modules}), file=sys.stderr)")


# An installed package has its bytecode compiled; a checkout under PYTHONDONTWRITEBYTECODE would compile rnnmon's
# modules again in every child (~0.1 s). The child may write it, and a first, unmeasured run does.
_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def _run(logdir: str) -> dict:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", _CHILD, logdir], capture_output=True,
                            text=True, check=True, env=_ENV)
    wall = time.perf_counter() - started
    child = json.loads(result.stderr.strip().splitlines()[-1])
    return {"wall_s": wall, **child, "json_bytes": len(result.stdout)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default="/tmp/rnnmon-report-runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=["input", "gpu"])
    parser.add_argument("--steps", nargs="+", type=int, default=[10_000, 1_000_000])
    args = parser.parse_args(argv)
    from synthetic_run import write_run

    results = {}
    for kind in args.kinds:
        for steps in args.steps:
            logdir = os.path.join(args.cache, f"{kind}-{steps}")
            run_dir = os.path.join(logdir, "run", "rnnmon")
            if not os.path.isdir(run_dir):
                print(f"writing {kind} run of {steps} steps into {run_dir} ...", file=sys.stderr)
                write_run(run_dir, steps, kind)
            _run(logdir)  # warm-up: bytecode written, the files in the page cache
            samples = [_run(logdir) for _ in range(args.repeats)]
            results[f"{kind} {steps}"] = {
                "wall_s": round(statistics.median(s["wall_s"] for s in samples), 2),
                "cpu_s": round(statistics.median(s["cpu_s"] for s in samples), 2),
                "peak_mb": round(max(s["peak_mb"] for s in samples)),
                "json_kb": round(samples[0]["json_bytes"] / 1024),
                "tensorflow_imported": any(s["tensorflow"] for s in samples)}
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"median of": args.repeats, "this process peak_mb": round(own),
                      "load average (1, 5, 15 min) at the end": [round(v, 2) for v in os.getloadavg()],
                      **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
