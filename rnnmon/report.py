"""`rnnmon report`: every run with rnnmon data under a log directory, as a table or as JSON.

Example:
    >>> print(render_text(build_report("runs")))
"""

from __future__ import annotations

import os
from typing import Any

from rnnmon.analysis import summarize
from rnnmon.reader import open_logdir, read_runs

VERDICT_TEXT = {
    "input-bound": "input-bound: the step waits for the input pipeline",
    "host-bound": "host-bound: Python or callbacks run between steps",
    "compute-bound": "compute-bound: the device is kept busy by the steps",
    "insufficient-data": "insufficient data: fewer than 10 steps",
}


def build_report(logdir: str) -> dict[str, Any]:
    """{"runs": [summary, ...]} for every rnnmon run under `logdir`, sorted by run name."""
    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"no such log directory: {logdir}")
    provider, ctx = open_logdir(logdir)
    runs = read_runs(provider, ctx)
    summaries = [summarize(runs[name]) for name in sorted(runs)]
    return {"runs": summaries, "comparison": compare(summaries)}


def compare(summaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The slowest and the fastest run by median step time, and the speedup between them."""
    timed = [s for s in summaries if s["step_ms"]["median"] and s["verdict"] != "insufficient-data"]
    if len(timed) < 2:
        return None
    slow = max(timed, key=lambda s: s["step_ms"]["median"])
    fast = min(timed, key=lambda s: s["step_ms"]["median"])
    return {"slowest": slow["run"], "fastest": fast["run"],
            "speedup": round(slow["step_ms"]["median"] / fast["step_ms"]["median"], 2)}


def render_text(report: dict[str, Any]) -> str:
    if not report["runs"]:
        return "No rnnmon data found. Add rnnmon.UtilizationMonitor(log_dir) to model.fit(callbacks=[...])."
    text = "\n\n".join(_render_run(run) for run in report["runs"])
    comparison = report.get("comparison")
    if comparison:
        text += (f"\n\nSpeedup: {comparison['fastest']} takes a {comparison['speedup']:.1f}x shorter median step "
                 f"than {comparison['slowest']}.")
    return text


def _render_run(run: dict[str, Any]) -> str:
    lines = [f"Run {run['run']}  ({run['backend'] or '?'} backend, {run['status']}, {run['steps']} steps, "
             f"{run['wall_s']:.1f} s)", f"  verdict        {VERDICT_TEXT.get(run['verdict'], run['verdict'])}",
             f"  summary        {run['summary']}"]
    step, wait = run["step_ms"], run["input_wait_ms"]
    lines.append(f"  step time      median {_ms(step['median'])}, p90 {_ms(step['p90'])}")
    if wait is None:
        lines.append(f"  input wait     {run['input_wait_measured']}")
    else:
        lines.append(f"  input wait     median {_ms(wait['median'])}, p90 {_ms(wait['p90'])}, "
                     f"{_pct(run['input_wait_fraction'])} of wall time")
    lines.append(f"  host gaps      {_pct(run['host_gap_fraction'])} of wall time")
    lines.append(f"  validation     {_pct(run['eval_fraction'])}, epoch ends {_pct(run['epoch_end_fraction'])}")
    if not run["gpus"]:
        lines.append("  GPUs           none seen by NVML (CPU-only); gaps below come from step phases")
    for gpu in run["gpus"]:
        lines.append(f"  GPU {gpu['index']}          {gpu['name']}: utilization {_num(gpu['util_mean'], '%')} mean, "
                     f"idle {_pct(gpu['idle_fraction'])} of {gpu['samples']} samples")
    gaps = sorted(run["idle_gaps"], key=lambda g: -g["duration_s"])
    by_cause = ", ".join(f"{cause} {seconds:.2f} s" for cause, seconds in run["idle_by_cause_s"].items() if seconds)
    lines.append(f"  idle gaps      {len(gaps)}" + (f" ({by_cause})" if by_cause else ""))
    for gap in gaps[:3]:
        lines.append(f"    {gap['duration_s'] * 1e3:8.1f} ms  cause {gap['cause']}")
    for finding in run["findings"][:5]:
        lines.append(f"  [{finding['severity']}] {finding['code']} at {finding['where']}: {finding['message']}")
        lines.append(f"      fix: {finding['advice']}")
    for alert in run["alerts"][-5:]:
        lines.append(f"  alert {alert.get('rule')}: {alert.get('message', '')}")
    for error in run["errors"]:
        lines.append(f"  error reading {error}")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.1f}{unit}"
