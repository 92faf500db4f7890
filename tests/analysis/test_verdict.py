"""The verdict's one home: its thresholds decide it, and every verdict has its words."""

from __future__ import annotations

import os

import pytest
from conftest import ROOT

from rnnmon.analysis import verdict

INPUT, HOST = verdict.INPUT_BOUND_SHARE, verdict.HOST_BOUND_SHARE


@pytest.mark.parametrize(("steps", "wait_s", "gap_s", "expected"), [
    (verdict.MIN_STEPS - 1, 5.0, 0.0, "insufficient-data"),
    (verdict.MIN_STEPS, INPUT * 10, HOST * 10, "input-bound"),  # input first; each threshold counts as reached
    (verdict.MIN_STEPS, INPUT * 9.9, HOST * 10, "host-bound"),
    (verdict.MIN_STEPS, INPUT * 9.9, HOST * 9.9, "compute-bound"),
])
def test_the_thresholds_decide_the_verdict(steps, wait_s, gap_s, expected):
    assert verdict.verdict(steps, wait_s, gap_s, step_total_s=10.0) == expected


def test_every_verdict_has_a_label_and_all_but_insufficient_data_advice():
    assert set(verdict.LABELS) == set(verdict.VERDICTS)
    assert set(verdict.ADVICE) == set(verdict.VERDICTS) - {"insufficient-data"}
    assert verdict.label("insufficient-data") == f"insufficient data: fewer than {verdict.MIN_STEPS} steps"
    assert verdict.label("not-yet-invented") == "not-yet-invented"  # a newer version's verdict, as written


def test_the_readme_states_the_verdicts_numbers():
    """The README explains the verdict in prose: its numbers are the module's, so changing one shows up here."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = " ".join(f.read().split())
    verdict_line = text.split("- **verdict** — ", 1)[1].split("- **", 1)[0]
    assert f"is ≥ {INPUT:.0%} of step time" in verdict_line
    assert f"are ≥ {HOST:.0%}, else `compute-bound`" in verdict_line
    assert f"`insufficient-data` below {verdict.MIN_STEPS} steps" in verdict_line
    assert f"≥ {INPUT:.0%} of step time" in text.split("| `INPUT_BOUND` |", 1)[1].split("|", 1)[0]
    assert f"≥ {HOST:.0%} of step time" in text.split("| `HOST_BOUND` |", 1)[1].split("|", 1)[0]
