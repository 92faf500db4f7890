"""Static input-pipeline findings read against the run they were found in.

The audit flags a generator, a one-worker `PyDataset` or a pipeline stage before the first step, as a risk.
When the run then measured its input wait and the steps hardly waited (< 5% of step time beyond the fetch
floor), the warning becomes info with that number: the user's pipeline is not what holds this run back, and
the verdict's "input overhead is small" is not contradicted. It still matters once steps get faster (a GPU).
Where the pipeline caches, the share is that of the epochs after the first, and the note gives the first epoch's
wait too: stages before the cache cost that epoch only.

Example:
    >>> summary = summarize(run)             # rnnmon.analysis.summary, which calls this module
    >>> [(f["code"], f["severity"]) for f in summary["findings"]]
    [('DATA_NOT_TF', 'info')]
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rnnmon.findings import Finding, codes

PIPELINE_CODES = codes("input pipeline", kind="static")  # the audit's risks; INPUT_BOUND is the measured one
QUIET_INPUT_SHARE = 0.05


def in_measured_context(findings: list[Finding], summary: dict[str, Any]) -> list[Finding]:
    """`findings` with pipeline warnings lowered to info where the run measured almost no input wait."""
    share = (summary.get("shares") or {}).get("input")
    if share is None or share >= QUIET_INPUT_SHARE or summary.get("verdict") in ("insufficient-data", "input-bound"):
        return findings
    fill = summary.get("cache_fill")
    if fill and (fill["input_share"] or 0.0) >= QUIET_INPUT_SHARE:  # the first epoch, filling the cache, waited
        note = (f" In this run the steps after the first epoch waited for input {100 * share:.1f}% of their time, "
                f"so it costs little once the cache at {fill['stage']} is filled; the first epoch, filling it, "
                f"waited {100 * fill['input_share']:.0f}% (CACHE_FILL).")
    else:
        note = (f" In this run the steps waited for input {100 * share:.1f}% of their time, so it costs little here; "
                "it matters once the steps get faster (on a GPU).")
    return [dataclasses.replace(f, severity="info", message=f.message + note)
            if f.code in PIPELINE_CODES and f.severity == "warning" else f for f in findings]
