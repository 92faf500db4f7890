"""The registry of finding codes: producers must declare their codes, old runs' codes still load, and the
README's findings table lists exactly the declared codes."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from conftest import ROOT, read_run

from rnnmon.analysis.summary import summarize
from rnnmon.findings import CODES, Finding
from rnnmon.format import schema
from rnnmon.format.writer import SummaryWriter


def readme_codes() -> list[str]:
    """The codes in the first column of the README's findings table, in order."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as file:
        section = file.read().split("\n## Findings\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [code for row in rows for code in re.findall(r"`([A-Z_]+)`", row.split("|")[1])]


def test_readme_table_lists_exactly_the_declared_codes():
    listed = readme_codes()
    assert len(listed) == len(set(listed)), "a code has two rows"
    assert set(listed) == set(CODES)


def test_a_finding_takes_its_codes_default_severity_unless_told():
    assert Finding.of("HOST_BOUND", "training loop", "m", "a", 1.2) == Finding(
        "HOST_BOUND", "warning", "training loop", "m", "a", 1.2)
    assert Finding.of("PIPELINE_NO_PREFETCH", "input pipeline", "m", "a", severity="info").severity == "info"


def test_an_undeclared_code_is_refused_where_it_is_made():
    with pytest.raises(ValueError, match="'INPUT_BOUNDED' is not declared"):
        Finding.of("INPUT_BOUNDED", "input pipeline", "m", "a")


def test_a_run_with_a_code_this_version_does_not_declare_still_loads(tmp_path):
    writer = SummaryWriter(str(tmp_path / "rnnmon"))
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "finished", "start": 1.0})
    writer.table(schema.STEPS_TAG, [(1, 0, 1.0, 1.01, 1.0, np.nan, 1), (2, 0, 1.02, 1.03, 1.0, 1.0, 1)])
    recorded = {"code": "TOMORROWS_CODE", "severity": "warning", "where": "model", "message": "m", "advice": "a"}
    writer.json(schema.FINDINGS_TAG, [recorded])
    writer.close()
    assert summarize(read_run(str(tmp_path)))["findings"] == [recorded]
