"""The tab's words for what runs record: each idle gap's cause and each phase kind.

Served in `/runs` (`labels`), so that the JavaScript holds colours only: a cause or phase kind added to
`rnnmon.format.schema` needs its words here, and `tests/tab/test_labels.py` fails until it has them.

Example:
    >>> LABELS["causes"]["input"], LABELS["phases"]["eval"]
    ('input pipeline', 'validation phase')
"""

from __future__ import annotations

CAUSE_LABELS = {  # rnnmon.format.schema.GAP_CAUSES
    "input": "input pipeline",
    "host": "host / Python",
    "eval": "validation",
    "other": "unexplained",
    "sync": "waiting for another GPU",
    "warmup": "warm-up (tracing, compiling)",
    "epoch_end": "epoch end",
}
PHASE_LABELS = {  # rnnmon.format.schema.PHASE_KINDS
    "eval": "validation phase",
    "epoch_end": "epoch end",
    "warmup": "warm-up (tracing)",
    "profile": "profiler start / save",
}
LABELS = {"causes": CAUSE_LABELS, "phases": PHASE_LABELS}
