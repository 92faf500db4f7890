"""The verdict's one home: its thresholds decide it, and every verdict has its words."""

from __future__ import annotations

import pytest

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
