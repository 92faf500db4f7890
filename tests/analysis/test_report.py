"""`rnnmon report` on log directories made by real fits: run as a subprocess where the command is checked (its exit
status, its imports, its output as a user gets it), through `rnnmon.cli.main` in this process where only what it
prints is (a process of its own costs 0.3-0.4 s of CPU to start)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest

from rnnmon.cli import main

TOP_KEYS = {"run", "backend", "steps", "wall_s", "step_ms", "input_wait_ms", "input_wait_fraction",
            "host_gap_fraction", "gpus", "idle_gaps", "verdict", "findings", "alerts"}


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, recorded_runs):
    """Two real fits without NVML (see `recorded_runs`): `slow`, input-bound (each batch 20 ms late, no prefetch),
    and `short`, 5 steps."""
    root = tmp_path_factory.mktemp("logs")
    shutil.copytree(recorded_runs / "cpu_fit", root / "slow")
    shutil.copytree(recorded_runs / "short", root / "short")
    return root


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rnnmon.cli", "report", *args], capture_output=True, text=True,
                          timeout=120)


def _printed(*args: str) -> str:
    """What `rnnmon report ARGS` prints, run by the CLI's `main` in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", *args]) == 0
    return out.getvalue()


def test_json_report_has_the_documented_shape(logdir):
    result = _report(str(logdir), "--json")
    assert result.returncode == 0, result.stderr
    runs = {run["run"]: run for run in json.loads(result.stdout)["runs"]}
    assert set(runs) == {"slow/rnnmon", "short/rnnmon"}
    slow = runs["slow/rnnmon"]
    assert set(slow) >= TOP_KEYS
    assert slow["backend"] == "tensorflow" and slow["steps"] == 30 and slow["gpus"] == []
    assert set(slow["step_ms"]) == {"median", "p90"} and slow["step_ms"]["median"] > 20
    assert 0.5 < slow["input_wait_fraction"] <= 1 and 0 <= slow["host_gap_fraction"] < 0.1
    assert slow["verdict"] == "input-bound"
    assert runs["short/rnnmon"]["verdict"] == "insufficient-data"
    for gap in slow["idle_gaps"]:
        assert {"device", "start", "end", "cause"} <= set(gap) and gap["start"] > 1.7e9
    findings = slow["findings"]  # ranked: the measured cause first, then the pipeline stages behind it
    assert [f["code"] for f in findings] == ["INPUT_BOUND", "PIPELINE_NO_PREFETCH", "PIPELINE_SERIAL_MAP",
                                             "PIPELINE_PY_FUNCTION"], findings
    assert findings[0]["severity"] == "critical" and findings[0]["speedup"] > 2  # a 20 ms stall on a ~3 ms step
    for finding in findings:
        assert set(finding) - {"speedup"} == {"code", "severity", "where", "message", "advice"}, finding
    assert all("python_stage" in f["message"] for f in findings[2:])  # the user's function, by name


def test_text_report_is_readable(logdir):
    result = _report(str(logdir))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "Run slow/rnnmon" in text and "input-bound: the step waits for the input pipeline" in text
    assert "insufficient data" in text and "CPU-only" in text
    assert "nan" not in text.lower().replace("n/a", "")


def test_missing_and_empty_logdirs_get_clear_messages(tmp_path):
    missing = _report(str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such log directory" in missing.stderr
    assert "No rnnmon data found" in _printed(str(tmp_path))


def test_report_never_imports_tensorflow(logdir):
    code = ("import sys; from rnnmon.cli import main; main(['report', sys.argv[1], '--json']); "
            "assert 'tensorflow' not in sys.modules, 'rnnmon report imported tensorflow'")
    result = subprocess.run([sys.executable, "-c", code, str(logdir)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["runs"]


def test_json_summarizes_gaps_and_gaps_all_lists_every_one(logdir):
    slow = {run["run"]: run for run in json.loads(_printed(str(logdir), "--json"))["runs"]}["slow/rnnmon"]
    count = slow["idle_gap_count"]
    assert count > 20 and len(slow["idle_gaps"]) == 20  # one gap per stalled step; the longest 20 listed
    durations = [gap["duration_s"] for gap in slow["idle_gaps"]]
    assert durations == sorted(durations, reverse=True)
    assert sum(bin["count"] for bin in slow["idle_gap_histogram"]) == count
    assert slow["idle_gaps_by_cause"]["input"]["count"] + slow["idle_gaps_by_cause"]["host"]["count"] > 0
    assert sum(cause["count"] for cause in slow["idle_gaps_by_cause"].values()) == count
    every = {run["run"]: run for run in json.loads(_printed(str(logdir), "--json", "--gaps", "all"))["runs"]}
    starts = [gap["start"] for gap in every["slow/rnnmon"]["idle_gaps"]]
    assert len(starts) == count and starts == sorted(starts)
    text = _printed(str(logdir), "--gaps", "all")
    assert sum(" ms  cause " in line for line in text.splitlines()) == count + (
        every["short/rnnmon"]["idle_gap_count"])


def test_text_report_escapes_control_characters_in_names(tmp_path):
    import numpy as np

    from rnnmon.format import schema
    from rnnmon.format.writer import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "evil\x1b]0;owned\x07\x1b[2J" / "rnnmon"))
    writer.json(schema.RUN_TAG, {"status": "finished\x1b[31m", "backend": "tensorflow"})
    writer.table(schema.STEPS_TAG, np.array([[1, 0, 10.0, 10.5, 1.0, np.nan, 1]]))
    writer.close()
    text = _printed(str(tmp_path))
    assert "\x1b" not in text and "\x07" not in text
    assert "evil\\x1b]0;owned\\x07\\x1b[2J" in text and "finished\\x1b[31m" in text


AS_NOBODY = """
import json, os, sys
from rnnmon.report import build_report, render_text
build_report(sys.argv[1])  # imports all the report needs while this interpreter's files are readable (they are root's)
if os.geteuid() == 0:  # root reads a mode-000 folder anyway: become the user nobody (65534)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
report = build_report(sys.argv[1])
print(json.dumps({"report": report, "text": render_text(report)}))
"""


def _report_as_nobody(logdir: str) -> dict:
    """`build_report` and `render_text` of `logdir` in a subprocess that runs them as the user nobody when this
    process is root, so file permissions apply as they do to a user."""
    result = subprocess.run([sys.executable, "-c", AS_NOBODY, logdir], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.skipif(os.geteuid() == 0 and not any(p.pw_uid == 65534 for p in pwd.getpwall()),
                    reason="root reads a mode-000 folder; dropping to the user nobody (65534) needs that user")
def test_an_unreadable_run_folder_gets_an_error_line(logdir):
    # A run folder the reader may not list (mode 000) was left out of the report without a word.
    root = tempfile.mkdtemp(prefix="rnnmon-unlisted-")  # outside pytest's root-only folder: nobody must reach it
    try:
        for run in ("slow", "locked"):
            shutil.copytree(logdir / ("slow" if run == "slow" else "short"), os.path.join(root, run))
        for folder, _, names in os.walk(root):
            os.chmod(folder, 0o755)
            for name in names:
                os.chmod(os.path.join(folder, name), 0o644)
        os.chmod(os.path.join(root, "locked", "rnnmon"), 0)
        answer = _report_as_nobody(root)
    finally:
        os.chmod(os.path.join(root, "locked", "rnnmon"), 0o755)
        shutil.rmtree(root)
    runs = {run["run"]: run for run in answer["report"]["runs"]}
    assert set(runs) == {"slow/rnnmon", "locked/rnnmon"}
    assert runs["slow/rnnmon"]["steps"] > 20 and runs["slow/rnnmon"]["errors"] == []
    (error,) = runs["locked/rnnmon"]["errors"]
    assert "cannot list the folder locked/rnnmon: Permission denied" in error
    assert f"  error reading {error}" in answer["text"]
