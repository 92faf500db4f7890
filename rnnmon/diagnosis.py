"""Findings from what a run measured: input-bound, host-bound, too little work per step, idle validation.

The thresholds follow the TensorFlow profiler's input-pipeline analysis: 20% of step time is "highly"
input-bound; 15% is high for host time between steps. Below 20% no input finding is made: fetching even a
ready batch costs ~0.3 ms on a CPU host, which is a noticeable share of a tiny step but nothing a pipeline
change can remove. Idle validation is judged on measured GPU utilization only.

Example:
    >>> summary = summarize(run)             # rnnmon.analysis, which calls this module
    >>> [f.code for f in measured_findings(summary)]
    ['INPUT_BOUND']
"""

from __future__ import annotations

from typing import Any

from rnnmon.findings import Finding

INPUT_HIGH = 0.20
HOST_HIGH = 0.15
LOW_UTIL_PCT, LOW_SM_ACTIVITY_PCT = 50.0, 30.0
EVAL_IDLE_SHARE = 0.10

_INPUT_ADVICE = ("End the pipeline with `.prefetch(tf.data.AUTOTUNE)`, give `map` and `interleave` "
                 "`num_parallel_calls=tf.data.AUTOTUNE`, `.cache()` what is loaded or decoded the same way every "
                 "epoch, and move Python preprocessing (`py_function`, generators) into TensorFlow ops.")


def measured_findings(summary: dict[str, Any]) -> list[Finding]:
    """Dynamic findings for one run's summary (see rnnmon.analysis.summarize)."""
    if summary["verdict"] == "insufficient-data":
        return []
    findings = _input(summary) + _host(summary) + _low_work(summary) + _eval_idle(summary)
    return findings


def summary_line(summary: dict[str, Any]) -> str:
    """One plain sentence: what held the device back, in this run's numbers."""
    verdict = summary["verdict"]
    shares = summary.get("shares", {})
    if verdict == "insufficient-data":
        return f"Only {summary['steps']} steps were recorded; train for at least 10 steps for a verdict."
    if verdict == "input-bound":
        return (f"Steps spent {_pct(shares.get('input'))} of their time waiting for the input pipeline: "
                "speed up the pipeline before anything else.")
    if verdict == "host-bound":
        return (f"{_pct(shares.get('host'))} of step time went to host work between steps (Python, callbacks): "
                "the device waited for the training loop.")
    gpus = [g for g in summary["gpus"] if g["util_mean"] is not None]
    if gpus and min(g["util_mean"] for g in gpus) < LOW_UTIL_PCT:
        return ("The input keeps up, yet the GPU is busy only "
                f"{min(g['util_mean'] for g in gpus):.0f}% of the time: each step gives it too little work.")
    return "The steps keep the device busy: input and host overhead are small."


def _input(summary: dict[str, Any]) -> list[Finding]:
    share = summary.get("shares", {}).get("input")
    if share is None or share < INPUT_HIGH:
        return []
    wait, step = summary["input_wait_ms"], summary["step_ms"]
    message = (f"Input wait is {_pct(share)} of step time: a step waits a median {wait['median']:.2f} ms "
               f"(p90 {wait['p90']:.2f} ms) for its batch out of a median {step['median']:.2f} ms step.")
    return [Finding("INPUT_BOUND", "critical", "input pipeline", message, _INPUT_ADVICE)]


def _host(summary: dict[str, Any]) -> list[Finding]:
    share = summary.get("shares", {}).get("host")
    if share is None or share < HOST_HIGH:
        return []
    message = (f"Host gaps between steps are {_pct(share)} of step time: after each step the device waited "
               "for Python (callbacks after rnnmon in the list, the progress bar, metric logging).")
    advice = ("Raise `steps_per_execution` in `model.compile` so several steps run per Python call, use "
              "`verbose=2` instead of the per-step progress bar, and move per-batch callback work to "
              "`on_epoch_end` or every N batches.")
    return [Finding("HOST_BOUND", "warning", "training loop", message, advice)]


def _low_work(summary: dict[str, Any]) -> list[Finding]:
    if summary["verdict"] != "compute-bound":
        return []
    findings = []
    for gpu in summary["gpus"]:
        util, sm = gpu["util_mean"], gpu["sm_activity_mean"]
        low_util = util is not None and util < LOW_UTIL_PCT
        low_sm = sm is not None and sm < LOW_SM_ACTIVITY_PCT
        if not (low_util or low_sm):
            continue
        measured = f"utilization {util:.0f}%" if util is not None else "utilization n/a"
        if sm is not None:
            measured += f", SM activity {sm:.0f}%"
        message = (f"GPU {gpu['index']} is not input- or host-bound, yet {measured} with a median step of "
                   f"{summary['step_ms']['median']:.2f} ms: each step is too small to fill it.")
        advice = ("Give each step more work: a larger batch (e.g. 4x, scaling the learning rate), longer "
                  "sequences or more units per layer; keep LSTM/GRU layers on the cuDNN kernel; raise "
                  "`steps_per_execution` so kernel launches are not paced by Python.")
        findings.append(Finding("LOW_WORK_PER_STEP", "warning", f"GPU {gpu['index']}", message, advice))
    return findings


def _eval_idle(summary: dict[str, Any]) -> list[Finding]:
    idle_s = summary["idle_by_cause_s"].get("eval", 0.0)
    wall = summary["wall_s"]
    if not summary["gpus"] or not wall or idle_s / wall < EVAL_IDLE_SHARE:
        return []
    message = (f"The GPU sat idle for {idle_s:.1f} s ({_pct(idle_s / wall)} of training time) "
               "during validation and epoch ends (checkpoints, callbacks).")
    advice = ("Validate less often (`validation_freq=N`), with a larger `validation_batch_size`, on a prefetched "
              "validation pipeline, and save checkpoints less often (`ModelCheckpoint(save_freq=...)`).")
    return [Finding("EVAL_IDLE", "warning", "validation", message, advice)]


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"
