"""Findings from what a run measured: input-bound, a cache filling, host-bound, too little work per step, idle
validation.

INPUT_BOUND and HOST_BOUND use the verdict's thresholds (rnnmon.analysis.verdict), so a finding never
contradicts the verdict. The input share counts only the wait beyond the fetch floor (what fetching a ready
batch costs, ~0.3 ms on a CPU host) and leaves out the longest waits (rnnmon.analysis.input_share); a floor of
10% or more of the step is SMALL_STEP, whose remedy is more work per step, not a faster pipeline. Under a
`tf.distribute` strategy the floor is the distributed iterator's, and the part of it the distribution adds
(splitting each batch across the replicas, see rnnmon.capture.fetch_floor) is DISTRIBUTED_SPLIT, judged
against the step as SMALL_STEP judges the rest. Every measured finding predicts one quantity: the fit's
training time (its wall time after the warm-up) without its cause, from what the run measured
(`summary["training_without_s"]`, rnnmon.analysis.fit_time), said in time and as `speedup`, the training time
over that time. Idle validation is judged on measured GPU utilization only.

Example:
    >>> summary = summarize(run)             # rnnmon.analysis.summary, which calls this module
    >>> [f.code for f in measured_findings(summary)]
    ['INPUT_BOUND']
"""

from __future__ import annotations

import math
from typing import Any

from rnnmon.analysis.input_advice import input_advice
from rnnmon.analysis.verdict import HOST_BOUND_SHARE, INPUT_BOUND_SHARE, MIN_STEPS
from rnnmon.findings import Finding, training_sentence, training_speedup

LOW_UTIL_PCT, LOW_SM_ACTIVITY_PCT = 50.0, 30.0
EVAL_IDLE_SHARE = 0.10
SMALL_STEP_FLOOR_SHARE, SMALL_STEP_TARGET_SHARE = 0.10, 0.05  # fetch floor / median step
RECOMPILE_SHARE, RECOMPILE_CRITICAL_SHARE = 0.05, 0.20  # of the fit's wall time


def measured_findings(summary: dict[str, Any]) -> list[Finding]:
    """Dynamic findings for one run's summary (see rnnmon.analysis.summary.summarize)."""
    if summary["verdict"] == "insufficient-data":
        return []
    return (_input(summary) + _cache_fill(summary) + _small_step(summary) + _distributed_split(summary)
            + _host(summary) + _eager(summary) + _recompile(summary) + _low_work(summary) + _eval_idle(summary))


def summary_line(summary: dict[str, Any]) -> str:
    """One plain sentence: what held the device back, in this run's numbers."""
    verdict = summary["verdict"]
    shares = summary.get("shares", {})
    if verdict == "insufficient-data":
        return f"Only {summary['steps']} steps were recorded; train for at least {MIN_STEPS} steps for a verdict."
    times = summary.get("time_s") or {}
    if verdict == "compile-bound":
        return (f"The training step was compiled again for new input shapes: {times['recompiles']:.2f} s, "
                f"{_pct(times['recompiles'] / times['training'])} of the fit's training time: give the batches a "
                "few fixed shapes before anything else.")
    if verdict == "input-bound":
        return (f"Steps spent {_pct(shares.get('input'))} of their time waiting for the input pipeline: "
                "speed up the pipeline before anything else.")
    if verdict == "host-bound":
        return (f"{_pct(shares.get('host'))} of step time went to host work between steps (Python, callbacks): "
                "the device waited for the training loop.")
    if times.get("training") and times["recompiles"] >= RECOMPILE_SHARE * times["training"]:
        return (f"Steps compiled again for input shapes new to the fit: {times['recompiles']:.2f} s, "
                f"{_pct(times['recompiles'] / times['training'])} of the fit's training time; the other steps keep "
                "the device busy.")
    gpus = [g for g in summary["gpus"] if g["util_mean"] is not None]
    timed = shares.get("input") is not None  # else the verdict's note says input wait was not measured
    if gpus and min(g["util_mean"] for g in gpus) < LOW_UTIL_PCT:
        return (f"{'The input keeps up, yet t' if timed else 'T'}he GPU is busy only "
                f"{min(g['util_mean'] for g in gpus):.0f}% of the time: each step gives it too little work.")
    if _cache_fill(summary):
        return (f"Once the first epoch had filled the cache (waiting {_pct(summary['cache_fill']['input_share'])} "
                "of its step time for input), the steps kept the device busy: input and host overhead are small.")
    return f"The steps keep the device busy: {'input and host overhead are' if timed else 'host overhead is'} small."


def _input(summary: dict[str, Any]) -> list[Finding]:
    share = summary.get("shares", {}).get("input")
    if share is None or share < INPUT_BOUND_SHARE:
        return []
    wait, step, floor = summary["input_wait_ms"], summary["step_ms"], summary.get("fetch_floor_ms")
    beyond = f"beyond the {floor:.2f} ms any fetch costs, " if floor else ""
    fill, cache = summary.get("cache_fill"), summary.get("input_cache")
    judged = f"In the epochs after the first (which filled the cache at {cache}), w" if fill else "W"
    training, without = summary["time_s"]["training"], summary["training_without_s"]["input_wait"]
    message = (f"{judged}aiting for the input pipeline ({beyond}longest waits left out) is {_pct(share)} of step "
               f"time: a step waits a median {wait['median']:.2f} ms (p90 {wait['p90']:.2f} ms) for its batch out "
               f"of a median {step['median']:.2f} ms step. Without that wait ({training - without:.2f} s beyond the "
               f"floor in all), {training_sentence(training, without)}.")
    if cache and not fill:
        message += (f" The pipeline caches ({cache}) and each fit ran one epoch, the one that fills the cache: "
                    "epochs after it would read from the cache.")
    advice = input_advice(summary.get("input_kind"), summary.get("backend"))
    return [Finding.of("INPUT_BOUND", "input pipeline", message, advice, training_speedup(training, without))]


def _cache_fill(summary: dict[str, Any]) -> list[Finding]:
    """The first epoch waited while it filled the cache, and the epochs after it did not."""
    fill, share = summary.get("cache_fill"), summary.get("shares", {}).get("input")
    training = summary["time_s"]["training"]
    if not fill or fill["input_share"] is None or fill["input_share"] < INPUT_BOUND_SHARE or share is None \
            or share >= INPUT_BOUND_SHARE or not training:
        return []
    without = training - fill["wait_s"]
    message = (f"The first epoch waited for the input pipeline {_pct(fill['input_share'])} of its step time "
               f"({fill['wait_s']:.2f} s beyond the fetch floor): that was `.cache()` at {fill['stage']} being "
               "filled, every element going once through the stages before it. The epochs after it read from the "
               f"cache and waited {_pct(share)}: the pipeline keeps up once cached. Without the fill's wait, "
               f"{training_sentence(training, without)}.")
    advice = ("Nothing to change for the epochs after the first. To fill the cache faster, give the stages before "
              "`.cache()` `num_parallel_calls=tf.data.AUTOTUNE`; to fill it once for many runs, cache to a file "
              "on a local disk: `.cache('/local/disk/file')`.")
    return [Finding.of("CACHE_FILL", fill["stage"], message, advice, training_speedup(training, without))]


def _small_step(summary: dict[str, Any]) -> list[Finding]:
    floor, step = summary.get("fetch_floor_ms"), summary["step_ms"]["median"]
    floor = floor and floor - (summary.get("distributed_split_ms") or 0.0)  # that part is DISTRIBUTED_SPLIT's
    if not floor or not step or floor / step < SMALL_STEP_FLOOR_SHARE:
        return []
    share = floor / step
    factor = math.ceil(share / SMALL_STEP_TARGET_SHARE)
    training = summary["time_s"]["training"]
    without = training - floor / 1e3 * summary["steps"] * (1 - 1 / factor)  # the same samples in 1/factor the steps
    message = (f"Fetching a batch that is already there costs {floor:.2f} ms on this host, {_pct(share)} of the "
               f"median {step:.2f} ms step: a fixed cost per step that no pipeline change removes. Doing {factor}x "
               f"the work per step brings it under {_pct(SMALL_STEP_TARGET_SHARE)}: for the same samples, "
               f"{training_sentence(training, without)}.")
    advice = (f"Give each step more work: `model.compile(..., steps_per_execution={factor})` (the batches of an "
              f"execution are fetched inside the graph), or a {factor}x larger batch (scale the learning rate).")
    return [Finding.of("SMALL_STEP", "training step", message, advice, training_speedup(training, without))]


def _distributed_split(summary: dict[str, Any]) -> list[Finding]:
    split, step = summary.get("distributed_split_ms"), summary["step_ms"]["median"]
    if not split or not step or split / step < SMALL_STEP_FLOOR_SHARE:
        return []
    share, partial = split / step, summary.get("partial_batch_ms") or 0.0
    training, fetches = summary["time_s"]["training"], summary["steps"]
    without = training - split / 1e3 * fetches
    check = (f", and {partial:.2f} ms of that checks every replica for a partial last batch (the batch shape is "
             "not static)" if partial / step >= SMALL_STEP_FLOOR_SHARE / 2 else "")
    message = (f"Under tf.distribute, fetching a batch that is already there costs {summary['fetch_floor_ms']:.2f} "
               f"ms, {split:.2f} ms more than on a plain iterator: the distributed iterator splits each batch "
               f"across the replicas{check}. That is {_pct(share)} of the median {step:.2f} ms step, paid on the "
               f"host before each step; the input pipeline itself keeps up. Without the split, "
               f"{training_sentence(training, without)}.")
    advice = ("Spread the split over more samples: a larger per-replica batch costs about the same per fetch "
              "(scale the learning rate).")
    if check:
        advice = (f"Batch with `drop_remainder=True` (or `.repeat()` the dataset and pass `steps_per_epoch`): a "
                  f"static batch shape turns the partial-batch check off: "
                  f"{training_sentence(training, training - partial / 1e3 * fetches)}. {advice}")
    return [Finding.of("DISTRIBUTED_SPLIT", "distributed iterator", message, advice,
                       training_speedup(training, without))]


def _host(summary: dict[str, Any]) -> list[Finding]:
    share = summary.get("shares", {}).get("host")
    if share is None or share < HOST_BOUND_SHARE:
        return []
    training, host_s = summary["time_s"]["training"], summary["time_s"]["host_gaps"]
    blame, cause = _callback_blame(summary.get("callback_hooks_s") or {}, host_s)
    without = summary["training_without_s"][cause]
    removed = "the callbacks' batch hooks" if cause == "callbacks" else "the host gaps"
    message = (f"Host gaps between steps are {_pct(share)} of step time, {host_s:.2f} s in all: after each step the "
               f"device waited for Python. {blame} Without {removed}, {training_sentence(training, without)}.")
    advice = ("Raise `steps_per_execution` in `model.compile` so several steps run per Python call, use "
              "`verbose=2` instead of the per-step progress bar, and move per-batch callback work to "
              "`on_epoch_end` or every N batches.")
    return [Finding.of("HOST_BOUND", "training loop", message, advice, training_speedup(training, without))]


EAGER_OPS = 20  # ops dispatched from Python in one step from which the step is eager (a compiled one: 0 or 1)
_COMPILE_ADVICE = {
    "tensorflow": "Wrap the step in `tf.function` (`train_step = tf.function(train_step)`; `jit_compile=True` for "
                  "XLA): the whole step then runs as one graph call.",
    "jax": "Wrap the step in `jax.jit`, with the model's state passed in and returned (`model.stateless_call`, "
           "`optimizer.stateless_apply`): the whole step then runs as one compiled call.",
}


def _eager(summary: dict[str, Any]) -> list[Finding]:
    """A loop's step dispatched its ops one by one from Python (rnnmon.capture.eager_steps): the Python between
    them, per step, is what compiling the step removes at least."""
    probe = summary.get("eager_probe") or {}
    if probe.get("ops", 0) < EAGER_OPS or not summary.get("step_ms"):
        return []
    wait_ms = (summary.get("input_wait_ms") or {}).get("median") or 0.0
    compute_ms = summary["step_ms"]["median"] - wait_ms
    python_ms = max(compute_ms - probe["in_ops_ms"], 0.0)
    training = summary["time_s"]["training"]
    without = max(training - python_ms / 1e3 * summary["steps"], 0.0)
    framework = probe.get("framework", "")
    message = (f"The training step runs eagerly: step {probe.get('step')} dispatched {probe['ops']} {framework} ops "
               f"one by one from Python (a compiled step dispatches one). Of the median step's {compute_ms:.1f} ms "
               f"of compute, {python_ms:.1f} ms ({_pct(python_ms / compute_ms if compute_ms > 0 else None)}) is "
               f"Python between those ops, which compiling removes; without it, "
               f"{training_sentence(training, without)}. The ops' own dispatch goes too: expect more.")
    advice = _COMPILE_ADVICE.get(framework, _COMPILE_ADVICE["tensorflow"])
    return [Finding.of("EAGER_STEP", "training step", message, advice, training_speedup(training, without))]


def _callback_blame(hooks_s: dict[str, float], host_s: float) -> tuple[str, str]:
    """Which callbacks' batch hooks take the host time, from the timing of each, and the cause removing it names:
    "callbacks" where their hooks take at least half of the host gaps, else "host_gaps"."""
    if not hooks_s:
        return "(Other callbacks' hooks were not timed: the fit call was not reachable.)", "host_gaps"
    name, seconds = max(hooks_s.items(), key=lambda item: item[1])
    total = sum(hooks_s.values())
    if total < 0.5 * host_s:
        return (f"Callbacks' batch hooks take {total:.2f} s of them: the rest is outside callbacks (Keras's loop, "
                "logging, garbage collection).", "host_gaps")
    if seconds >= 0.5 * host_s:
        return f"The batch hooks of {name} take {seconds:.2f} s of them.", "callbacks"
    return f"Callbacks' batch hooks take {total:.2f} s of them, {name}'s {seconds:.2f} s the most.", "callbacks"


def _recompile(summary: dict[str, Any]) -> list[Finding]:
    times = summary.get("time_s") or {}
    lost, training = times.get("recompiles", 0.0), times.get("training", 0.0)
    if not training or lost < RECOMPILE_SHARE * training:
        return []
    steps = [step for step in summary["slow_steps"] if step["cause"] == "recompile"]
    named = "; ".join(f"step {step['step']} on {_shapes(step['shapes'])}"
                      + (f" after {_shapes(step['previous_shapes'])}" if step["previous_shapes"] else "")
                      + f", {step['excess_s']:.2f} s" for step in steps[:3])
    count = summary["slow_step_count"]["recompile"]
    by = {step.get("compiled_by") for step in steps} - {None}
    signal = f" ({', '.join(sorted(by))} compile events)" if by else ""
    message = (f"{count} step{'s' if count > 1 else ''} compiled the training step again{signal} "
               f"({named}{'; ...' if count > 3 else ''}): {lost:.2f} s beyond a step on shapes already seen, "
               f"{_pct(lost / training)} of the fit's training time. Without the recompiles "
               f"{training_sentence(training, training - lost)}.")
    changed = {_changed(step["previous_shapes"], step["shapes"]) for step in steps}
    fixes = summary.get("compile_fixes")
    advice, best = [], training - lost
    if "batch" in changed:
        advice.append("Give every batch the same size: `dataset.batch(n, drop_remainder=True)` (or arrays trimmed to "
                      "a multiple of `batch_size`), or pad the last batch to the full size with zero sample weights.")
    if fixes is not None:
        best = min(fixes["one_length"]["training_s"], fixes["buckets"]["training_s"])
        advice += _length_fixes(fixes, training, summary.get("input_kind"))
    elif "length" in changed or not advice:
        advice.append("Give the batches a few fixed shapes: `padded_batch` to one length, or "
                      "`bucket_by_sequence_length(..., pad_to_bucket_boundary=True, drop_remainder=True)`.")
    severity = "critical" if lost >= RECOMPILE_CRITICAL_SHARE * training else None
    return [Finding.of("RECOMPILE", "input shapes", message, " ".join(advice),
                       training_speedup(training, best), severity=severity)]


def _length_fixes(fixes: dict[str, Any], training: float, input_kind: str | None) -> list[str]:
    """The advice for each of the two fixes (rnnmon.analysis.compile_advice), with its prediction; a fix the
    pipeline has already made is not advised again."""
    one, buckets = fixes["one_length"], fixes["buckets"]
    shortest, longest = fixes["lengths"]
    tf_data = input_kind in (None, "tf.data")

    def predicted(fix: dict[str, Any]) -> str:
        return (f"predicted {fix['training_s']:.1f} s instead of {training:.1f} s after the warm-up, "
                f"{training_speedup(training, fix['training_s']):.2f}x")

    pad = (f"`padded_batch(n, padded_shapes=(({one['length']},), ()), drop_remainder=True)`" if tf_data
           else f"pad every batch to length {one['length']}")
    advice = [f"Pad every batch to one length ({pad}; lengths seen {shortest}-{longest}): one compile, every step "
              f"at the longest length, {predicted(one)}."]
    boundaries = ", ".join(str(length + 1) for length in buckets["lengths"])  # each pads to its boundary - 1
    bucket_call = (f"`bucket_by_sequence_length(length_fn, bucket_boundaries=[{boundaries}], "
                   f"bucket_batch_sizes=[n] * {len(buckets['lengths']) + 1}, pad_to_bucket_boundary=True, "
                   "drop_remainder=True)`")
    if fixes.get("batching") == "bucket_by_sequence_length":
        advice.append("The pipeline buckets already (bucket_by_sequence_length), yet its batches still come in many "
                      "shapes: pass `pad_to_bucket_boundary=True` and `drop_remainder=True`, so that each bucket has "
                      "one shape and compiles once.")
    elif len(buckets["lengths"]) > 1:
        how = bucket_call if tf_data else f"batches of similar lengths, each padded to one of {buckets['lengths']}"
        advice.append(f"Or bucket by length ({how}): {buckets['compiles']} compiles, each step at its bucket's "
                      f"boundary, {predicted(buckets)}.")
    return advice


def _shapes(shapes: list | None) -> str:
    return ", ".join("?" if shape is None else f"({', '.join('?' if n is None else str(n) for n in shape)}"
                     f"{',' if len(shape) == 1 else ''})" for shape in shapes or [])


def _changed(before: list | None, after: list) -> str:
    """"batch" when only the leading (batch) sizes changed, else "length" (a sequence length or another size)."""
    if before is None or len(before) != len(after):
        return "length"
    for old, new in zip(before, after):
        if old is None or new is None or len(old) != len(new) or old[1:] != new[1:]:
            return "length"
    return "batch"


def _low_work(summary: dict[str, Any]) -> list[Finding]:
    if summary["verdict"] != "compute-bound":
        return []
    findings = []
    training, steps_s = summary["time_s"]["training"], summary["time_s"]["steps"]
    for gpu in summary["gpus"]:
        util, sm = gpu["util_mean"], gpu["sm_activity_mean"]
        low_util = util is not None and util < LOW_UTIL_PCT
        low_sm = sm is not None and sm < LOW_SM_ACTIVITY_PCT
        if not (low_util or low_sm):
            continue
        measured = f"utilization {util:.0f}%" if util is not None else "utilization n/a"
        if sm is not None:
            measured += f", SM activity {sm:.0f}%"
        # More work per step can at most fill what the GPU leaves unused: all its SMs (SM activity), or,
        # where only NVML utilization is known, the time no kernel ran (kernels that fill few SMs hide more).
        busy_pct, basis = (sm, "its SMs were active") if sm is not None else (util, "a kernel ran")
        without = training - steps_s * (1 - busy_pct / 100)  # the same samples, the steps' time filled
        message = (f"GPU {gpu['index']} is not input- or host-bound, yet {measured} with a median step of "
                   f"{summary['step_ms']['median']:.2f} ms: each step is too small to fill it. Filling it "
                   f"({basis} {busy_pct:.0f}% of the time), for the same samples "
                   f"{training_sentence(training, without)}.")
        advice = ("Give each step more work: a larger batch (e.g. 4x, scaling the learning rate), longer "
                  "sequences or more units per layer; keep LSTM/GRU layers on the cuDNN kernel; raise "
                  "`steps_per_execution` so kernel launches are not paced by Python.")
        findings.append(Finding.of("LOW_WORK_PER_STEP", f"GPU {gpu['index']}", message, advice,
                                   training_speedup(training, without)))
    return findings


def _eval_idle(summary: dict[str, Any]) -> list[Finding]:
    idle_s = summary["idle_by_cause_s"].get("eval", 0.0) + summary["idle_by_cause_s"].get("epoch_end", 0.0)
    training = summary["time_s"]["training"]
    if not summary["gpus"] or not training or idle_s / training < EVAL_IDLE_SHARE:
        return []
    message = (f"The GPU sat idle for {idle_s:.1f} s ({_pct(idle_s / training)} of the fit's training time) during "
               "validation and epoch ends (checkpoints, callbacks). Validating every 5th epoch, "
               f"{training_sentence(training, training - 0.8 * idle_s)}; without that idle time, "
               f"{training_sentence(training, training - idle_s)}.")
    advice = ("Validate less often (`validation_freq=N`), with a larger `validation_batch_size`, on a prefetched "
              "validation pipeline, and save checkpoints less often (`ModelCheckpoint(save_freq=...)`).")
    return [Finding.of("EVAL_IDLE", "validation", message, advice, training_speedup(training, training - idle_s))]


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"
