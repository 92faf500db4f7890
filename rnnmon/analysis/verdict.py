"""The verdict: what held a run's steps back (compiles, input, host work between steps, or nothing), and its words.

The one home of the verdict's thresholds, names, one-line labels and advice: the summary, the measured findings,
the Prometheus exporter, the report and the TensorBoard tab (through `/summary`) all read them here. Shares are
of step time (step + host gap), with the TensorFlow profiler's thresholds; the compile share is of the training
time (the fit after its warm-up), as the RECOMPILE finding counts it. Stdlib only: the exporter runs inside
the training process and must not import the reader.

Example:
    >>> verdict(steps=100, wait_s=3.0, gap_s=0.5, step_total_s=10.0)
    'input-bound'
    >>> label("insufficient-data")
    'insufficient data: fewer than 10 steps'
"""

from __future__ import annotations

INPUT_BOUND_SHARE = 0.20  # the profiler's "highly input-bound"
HOST_BOUND_SHARE = 0.15  # the profiler's "high" for kernel-launch / other host time
COMPILE_BOUND_SHARE = 0.20  # compiles after the warm-up, of the training time: as much as input-bound asks
MIN_STEPS = 10

VERDICTS = ("input-bound", "host-bound", "compute-bound", "insufficient-data", "compile-bound")
LABELS = {
    "compile-bound": "compile-bound: steps wait for the step to be compiled again for new input shapes",
    "input-bound": "input-bound: the step waits for the input pipeline",
    "host-bound": "host-bound: Python or callbacks run between steps",
    "compute-bound": "compute-bound: the device is kept busy by the steps",
    "insufficient-data": f"insufficient data: fewer than {MIN_STEPS} steps",
}
ADVICE = {  # what to do next when a run has no finding to say it; none without a verdict
    "compile-bound": "Give the batches a few fixed shapes: pad to one length, or bucket with "
                     "bucket_by_sequence_length(..., pad_to_bucket_boundary=True, drop_remainder=True).",
    "input-bound": "Overlap input with compute: map(..., num_parallel_calls=tf.data.AUTOTUNE) and "
                   ".prefetch(tf.data.AUTOTUNE); cache decoded data when it fits.",
    "host-bound": "Cut Python work between steps: fewer per-batch callbacks and logging, or raise "
                  "steps_per_execution.",
    "compute-bound": "The steps keep the device busy; further speed comes from the model itself "
                     "(cuDNN-eligible RNN layers, mixed precision, larger batches).",
}


def verdict(steps: int, wait_s: float, gap_s: float, step_total_s: float, compile_s: float = 0.0,
            training_s: float = 0.0) -> str:
    """One of `VERDICTS` for `steps` steps that waited `wait_s` for input and `gap_s` between them, of
    `step_total_s` (steps + gaps), and compiled for `compile_s` of `training_s` after the warm-up. Compiles win
    where their share is at least `COMPILE_BOUND_SHARE` and the largest of the three."""
    if not judged(steps, step_total_s):
        return "insufficient-data"
    shares = {"input": wait_s / step_total_s, "host": gap_s / step_total_s,
              "compile": compile_s / training_s if training_s > 0 else 0.0}
    if shares["compile"] >= COMPILE_BOUND_SHARE and shares["compile"] == max(shares.values()):
        return "compile-bound"
    if shares["input"] >= INPUT_BOUND_SHARE:
        return "input-bound"
    if shares["host"] >= HOST_BOUND_SHARE:
        return "host-bound"
    return "compute-bound"


def judged(steps: int, step_total_s: float) -> bool:
    """Whether `steps` steps (each fit's first left out) of `step_total_s` (steps + host gaps) get a verdict other
    than insufficient-data."""
    return not (steps < MIN_STEPS or step_total_s <= 0)


def label(name: str) -> str:
    """The one-line label of verdict `name`; an unknown name (a newer version's) as it is."""
    return LABELS.get(name, name)
