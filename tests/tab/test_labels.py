"""The tab's words cover every gap cause and phase kind a run can record."""

from __future__ import annotations

from rnnmon_tensorboard.labels import CAUSE_LABELS, PHASE_LABELS

from rnnmon.format import schema


def test_every_cause_and_phase_kind_has_its_words():
    assert list(CAUSE_LABELS) == list(schema.GAP_CAUSES)
    assert list(PHASE_LABELS) == list(schema.PHASE_KINDS)
