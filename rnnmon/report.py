"""`rnnmon report`: every run with rnnmon data under a log directory, as a table or as JSON.

Runs are read from their event files by `rnnmon.format.logdir.read_logdir`: no TensorFlow is imported; a run with a
reading index is read through its digest (`rnnmon.format.digest_read`), so its cost does not grow with its steps.
Names and messages come from files anyone could have written, so the text report shows control characters escaped.

Example:
    >>> print(render_text(build_report("runs")))
    >>> build_report("runs", all_gaps=True)["runs"][0]["idle_gaps"]     # every gap, in time order
"""

from __future__ import annotations

import os
import re
import statistics
from typing import Any

from rnnmon.analysis.stragglers import compare_workers, worker_of
from rnnmon.analysis.summary import gap_list, summarize
from rnnmon.analysis.trials import compare_trials
from rnnmon.analysis.verdict import label
from rnnmon.analysis.worker_figures import worker_figures
from rnnmon.format.logdir import read_logdir
from rnnmon.storage import remote
from rnnmon.storage.mirror import Mirror

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def build_report(logdir: str, all_gaps: bool = False) -> dict[str, Any]:
    """{"runs": [summary, ...], "comparison", "workers", "trials"} for every rnnmon run under `logdir`, sorted by
    run name.

    `workers` compares the workers of each multi-worker job (runs `[job/]worker-<index>/rnnmon`), `trials` the
    trials of each KerasTuner search (runs `trial_<id>/rnnmon`, see rnnmon.analysis.trials).

    A summary lists the longest idle gaps; with `all_gaps` its `idle_gaps` holds every gap, in time order.
    `logdir` may be a `gs://` or `s3://` URL (docs/storage.md).
    """
    if remote.is_remote(logdir):  # read through an on-disk mirror, downloading only new and changed objects
        remote.check(logdir)
        mirror = Mirror(logdir)
        logdir = mirror.sync()  # OSError, without credentials, when the store cannot be listed
        if not mirror.objects:
            raise FileNotFoundError(f"no such log directory: {mirror.shown} (no objects under it)")
    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"no such log directory: {logdir}")
    runs = read_logdir(logdir, digest=not all_gaps)  # a summary reads an indexed run's digest, not its tables
    summaries = []
    for name in sorted(runs):
        summary = summarize(runs[name])
        if all_gaps:
            gaps = runs[name].gaps
            summary["idle_gaps"] = gap_list(gaps[gaps[:, 1].argsort(kind="stable")])
        summaries.append(summary)
    workers = compare_workers([worker_figures(runs[name]) for name in sorted(runs) if worker_of(name)])
    return {"runs": summaries, "comparison": compare(summaries), "workers": workers,
            "trials": compare_trials(summaries)}


def compare(summaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The slowest and the fastest of two or more different runs by median step time, and the speedup between
    them; None when fewer than two can be told apart.

    The workers of one multi-worker job are not different runs: they share every step, so they count as one, the
    job (`<job>/* (<n> workers)`, its workers' median step). Runs whose medians tie give no speedup.
    """
    steps: dict[tuple[str, bool], list[float]] = {}  # (run or job, a job's workers) -> median steps
    for summary in summaries:
        if summary["step_ms"]["median"] and summary["verdict"] != "insufficient-data":
            worker = worker_of(summary["run"])
            key = (summary["run"], False) if worker is None else (worker[0], True)
            steps.setdefault(key, []).append(summary["step_ms"]["median"])
    medians = {f"{name}/* ({len(values)} workers)" if job else name: statistics.median(values)
               for (name, job), values in steps.items()}
    if len(medians) < 2:
        return None
    slow = max(medians, key=lambda name: medians[name])
    fast = min(medians, key=lambda name: medians[name])
    if medians[slow] <= medians[fast]:
        return None
    return {"slowest": slow, "fastest": fast, "speedup": round(medians[slow] / medians[fast], 2)}


def render_text(report: dict[str, Any], all_gaps: bool = False) -> str:
    """The report for a terminal; with `all_gaps` (a report built with it) every gap gets a line."""
    if not report["runs"]:
        return "No rnnmon data found. Add rnnmon.UtilizationMonitor(log_dir) to model.fit(callbacks=[...])."
    text = "\n\n".join(_render_run(run, all_gaps) for run in report["runs"])
    comparison = report.get("comparison")
    if comparison:
        text += (f"\n\nSpeedup: {_clean(comparison['fastest'])} takes a {comparison['speedup']:.1f}x shorter median "
                 f"step than {_clean(comparison['slowest'])}.")
    for group in report.get("workers", []):
        text += "\n\n" + _render_workers(group)
    for group in report.get("trials", []):
        text += "\n\n" + _render_trials(group)
    return text


def _render_trials(group: dict[str, Any]) -> str:
    lines = [f"Trials of search {group['search'] or '?'} ({len(group['trials'])})",
             "  trial     time/epoch   median step   input wait   verdict          hyperparameters"]
    for row in group["trials"]:
        epoch = "n/a" if row["epoch_s"] is None else f"{row['epoch_s']:.2f} s"
        values = ", ".join(f"{name}={value}" for name, value in row["hyperparameters"].items())
        lines.append(f"  {row['trial']:<8}{epoch:>12}  {_ms(row['step_ms']):>12}  {_pct(row['input_share']):>11}   "
                     f"{row['verdict']:<16} {values}")
    bound = group["input_bound"]
    lines.append(f"  input-bound: {', '.join(f'trial {t}' for t in bound)}" if bound else "  input-bound: none")
    if group["speedup"] is not None:
        lines.append(f"  fastest: trial {group['fastest']}, {group['speedup']:.2f}x less time per epoch than trial "
                     f"{group['slowest']}, the slowest")
    if group.get("caveat"):
        lines.append(f"  caveat: {group['caveat']}")
    return "\n".join(_clean(line) for line in lines)


def _render_workers(group: dict[str, Any]) -> str:
    lines = [f"Workers of {_clean(group['job'])} ({len(group['workers'])})",
             "  worker            median step    input wait    host gap    GPU idle"]
    for row in group["workers"]:
        lines.append(f"  {_clean(row['worker']):<16}{_ms(row['step_ms']):>12}  {_ms(row['input_wait_ms']):>12}  "
                     f"{_pct(row['host_gap_fraction']):>10}  {_pct(row['gpu_idle_fraction']):>10}")
    for finding in group["findings"]:
        lines.append(f"  [{finding['severity']}] {finding['code']} at {_clean(finding['where'])}: "
                     f"{_clean(finding['message'])}")
        lines.append(f"      fix: {_clean(finding['advice'])}")
    return "\n".join(lines)


def _clean(text: Any) -> str:
    """`text` with control and bidi characters shown as escapes, so a run name cannot drive the terminal."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), str(text))


def _render_run(run: dict[str, Any], all_gaps: bool) -> str:
    lines = [f"Run {run['run']}  ({run['backend'] or '?'} backend, {run['status']}, {run['steps']} steps, "
             f"{run['time_s']['fit']:.1f} s)", f"  verdict        {label(run['verdict'])}",
             f"  summary        {run['summary']}"]
    step, wait = run["step_ms"], run["input_wait_ms"]
    lines.append(f"  step time      median {_ms(step['median'])}, p90 {_ms(step['p90'])}")
    if wait is None:
        lines.append(f"  input wait     {run['input_wait_measured']}")
    else:
        coverage = run.get("input_wait_coverage")
        sample = (f" (timed on {_pct(coverage)} of the batches: {run['input_wait_measured']})"
                  if coverage is not None and coverage < 1 else "")
        lines.append(f"  input wait     median {_ms(wait['median'])}, p90 {_ms(wait['p90'])}, "
                     f"{_pct(run['input_wait_fraction'])} of wall time{sample}")
        if run.get("cache_fill"):
            fill = run["cache_fill"]
            lines.append(f"                 judged on the epochs after the first, which filled the cache at "
                         f"{fill['stage']}: {fill['wait_s']:.2f} s of wait beyond the fetch floor")
    lines.append(f"  host gaps      {_pct(run['host_gap_fraction'])} of wall time")
    lines.append(f"  validation     {_pct(run['eval_fraction'])}, epoch ends {_pct(run['epoch_end_fraction'])}")
    lines.append(f"  time           {_time_parts(run['time_s'])}")
    if run["slow_steps"]:
        lines.append(f"  slow steps     {_slow_steps(run['slow_step_count'], run['slow_steps'])}")
    if not run["gpus"]:
        lines.append("  GPUs           none seen by NVML (CPU-only); gaps below come from step phases")
    for gpu in run["gpus"]:
        sync_s = gpu.get("idle_by_cause_s", {}).get("sync")
        lines.append(f"  GPU {gpu['index']}          {gpu['name']}: {_utilization(gpu)}"
                     + (f", {sync_s:.2f} s waiting for other GPUs" if sync_s else ""))
    by_cause = ", ".join(f"{cause} {seconds:.2f} s" for cause, seconds in run["idle_by_cause_s"].items() if seconds)
    lines.append(f"  idle gaps      {run['idle_gap_count']}" + (f" ({by_cause})" if by_cause else ""))
    if all_gaps:
        origin = run["idle_gaps"][0]["start"] if run["idle_gaps"] else 0.0
        lines += [f"    +{gap['start'] - origin:10.3f} s {gap['duration_s'] * 1e3:10.1f} ms  cause {gap['cause']}"
                  + ("" if gap["device"] is None else f"  GPU {gap['device']}") for gap in run["idle_gaps"]]
    else:
        lines += [f"    {gap['duration_s'] * 1e3:8.1f} ms  cause {gap['cause']}" for gap in run["idle_gaps"][:3]]
    for finding in run["findings"][:5]:
        lines.append(f"  [{finding['severity']}] {finding['code']} at {finding['where']}: {finding['message']}")
        lines.append(f"      fix: {finding['advice']}")
    for alert in run["alerts"][-5:]:
        lines.append(f"  alert {alert.get('rule')}: {alert.get('message', '')}")
    for error in run["errors"]:
        lines.append(f"  error reading {error}")
    for note in run["notes"]:
        lines.append(f"  note           {note}")
    return "\n".join(_clean(line) for line in lines)


def _time_parts(times: dict[str, float]) -> str:
    """The fit's wall time and the parts it is made of (those above a millisecond), in seconds."""
    names = {"warmup": "warm-up", "steps": "steps", "recompiles": "recompiles", "slow_steps": "other slow steps",
             "host_gaps": "host gaps", "validation": "validation", "epoch_ends": "epoch ends",
             "profiling": "profiling"}
    parts = [f"{label} {times[name]:.2f} s" + (f" (input wait {times['input_wait']:.2f} s)"
                                              if name == "steps" and times["input_wait"] >= 0.001 else "")
             for name, label in names.items() if abs(times[name]) >= 0.001]
    unaccounted = times["unaccounted"]
    tail = f"; {unaccounted:.2f} s in none of them" if abs(unaccounted) >= max(0.001, 0.02 * times["fit"]) else ""
    return f"{times['fit']:.2f} s: " + ", ".join(parts) + tail


def _slow_steps(counts: dict[str, int], steps: list[dict[str, Any]]) -> str:
    """How many steps were far above the median, and the longest three with their cause."""
    why = {"recompile": "new input shapes, compiled again", "input": "waited for input",
           "unknown": "cause not seen (load, garbage collection, a retrace)"}
    listed = "; ".join(f"step {step['step']} {step['duration_s'] * 1e3:.0f} ms, {why.get(step['cause'], step['cause'])}"
                       for step in steps[:3])
    return f"{sum(counts.values())} far above the median: {listed}" + ("; ..." if sum(counts.values()) > 3 else "")


def _utilization(gpu: dict[str, Any]) -> str:
    source = gpu.get("utilization", "nvml")
    if source not in ("nvml", "gpm"):  # MIG without GPM: NVML has no utilization for it
        return f"utilization {source}; gaps below come from step phases"
    what = "SM activity (GPM, in place of utilization)" if source == "gpm" else "utilization"
    return (f"{what} {_num(gpu['util_mean'], '%')} mean, idle {_pct(gpu['idle_fraction'])} of "
            f"{gpu['samples']} samples")


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.1f}{unit}"
