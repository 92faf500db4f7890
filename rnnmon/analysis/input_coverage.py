"""What a verdict says about the input wait it was judged on: nothing where every batch was timed, a note where
only a sample was (TensorFlow with `steps_per_execution > 1`), and where none was, that the verdict leaves input
out and how to time it.

The run description's `input_wait` says how the fit timed it: "measured", "sampled: 1 execution in N", or
"not measured: <why>" (see rnnmon.capture.input_timing).

Example:
    >>> input_wait_note("not measured: measure_input_wait=False", None)
    'Input wait was not measured (measure_input_wait=False), so this verdict leaves it out: ...'
    >>> input_wait_note("sampled: 1 execution in 16", 0.0652)
    'Input wait was timed on a sample (1 execution in 16, 6.5% of the batches); ...'
"""

from __future__ import annotations

_HOW = {  # why it was not measured -> how to measure it
    "measure_input_wait=False": "drop `measure_input_wait=False` from `UtilizationMonitor` to time it.",
    "steps_per_execution": ("record the fit again with this rnnmon, which at `steps_per_execution > 1` times one "
                            "execution in 16 by default (`measure_input_wait=True` times every one)."),
}


def input_wait_note(how_measured: str | None, coverage: float | None) -> str | None:
    """The note a verdict carries about input wait: `how_measured` is the run description's `input_wait`,
    `coverage` the share of batches whose wait was timed (None: none was)."""
    if coverage is None:
        prefix = "not measured: "
        why = how_measured[len(prefix):] if how_measured and how_measured.startswith(prefix) else "no step was timed"
        how = next((text for key, text in _HOW.items() if why.startswith(key)),
                   "on this backend it is part of the host gap." if why.startswith("the ") else
                   "record the fit with `UtilizationMonitor(measure_input_wait=True)`.")
        return f"Input wait was not measured ({why}), so this verdict leaves it out: {how}"
    if coverage < 1:
        sample = (how_measured or "").removeprefix("sampled: ")
        of = f"{sample}, " if how_measured and how_measured.startswith("sampled: ") else ""
        return (f"Input wait was timed on a sample ({of}{100 * coverage:.1f}% of the batches); its share of step "
                "time and its seconds are estimated from them.")
    return None
