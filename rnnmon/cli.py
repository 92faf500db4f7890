"""The `rnnmon` command: `rnnmon report LOGDIR [--json] [--gaps all]` and `rnnmon demo [--logdir runs]`.

Example:
    $ rnnmon demo --logdir runs
    $ rnnmon report runs --json
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rnnmon", description="Why is my GPU idle? Per-step answers for Keras.")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="summarize every rnnmon run under LOGDIR")
    report.add_argument("logdir", help="a folder, or gs://bucket/path or s3://bucket/path")
    report.add_argument("--json", action="store_true", help="print machine-readable JSON")
    report.add_argument("--gaps", choices=("longest", "all"), default="longest",
                        help="list the 20 longest idle gaps per run (default) or every one, in time order")
    demo = commands.add_parser("demo", help="train a small LSTM twice (input-bound, tuned) with the monitor")
    demo.add_argument("--logdir", default="runs")
    args = parser.parse_args(argv)

    if args.command == "report":
        from rnnmon.report import build_report, render_text
        from rnnmon.storage.remote import CredentialsInURL

        try:
            result = build_report(args.logdir, all_gaps=args.gaps == "all")
        except (OSError, CredentialsInURL) as error:  # no such folder, a bucket that cannot be listed
            print(f"rnnmon: {error}", file=sys.stderr)
            return 2
        print(json.dumps(result, indent=2) if args.json else render_text(result, all_gaps=args.gaps == "all"))
        return 0
    from rnnmon.demo import run_demo

    return run_demo(args.logdir)


if __name__ == "__main__":
    sys.exit(main())
