"""`rnnmon demo`'s two pipelines and its closing line, without its two fits (those run in tests/tab and
tests/analysis/test_speedup_prediction.py, in the full suite).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

from rnnmon import audit, demo


def test_the_input_bound_pipeline_gets_the_findings_its_tuned_twin_fixes():
    model = demo.make_model()
    slow = {f.code: f for f in audit(model, demo.make_dataset(False))}
    tuned = {f.code: f for f in audit(model, demo.make_dataset(True))}
    assert {code: f.severity for code, f in slow.items()} == {
        "PIPELINE_SERIAL_MAP": "warning", "PIPELINE_PY_FUNCTION": "warning", "PIPELINE_NO_PREFETCH": "info"}
    assert "(defined at demo.py:" in slow["PIPELINE_SERIAL_MAP"].message  # the README's example names the line
    # Tuned: parallel calls and a prefetch; the Python decode itself stays, as a note.
    assert {code: f.severity for code, f in tuned.items()} == {"PIPELINE_PY_FUNCTION": "info"}


def test_the_closing_line_puts_the_prediction_beside_the_training_time_achieved():
    def run(name, training_s, findings):
        return {"run": f"{name}/rnnmon", "time_s": {"training": training_s}, "findings": findings}

    bound = {"code": "INPUT_BOUND", "speedup": 2.6}
    report = {"runs": [run("input_bound", 7.8, [{"code": "PIPELINE_SERIAL_MAP"}, bound]), run("tuned", 2.5, [])]}
    assert demo.predicted_vs_achieved(report) == (
        "\nPredicted by INPUT_BOUND: 3.0 s instead of 7.8 s after the warm-up, 2.60x; achieved: the tuned run took "
        "2.5 s after its warm-up: 3.12x.")
    report["runs"][0]["findings"] = []
    assert demo.predicted_vs_achieved(report) == (
        "\nAchieved: the tuned run took 2.5 s after its warm-up: 3.12x (no measured finding predicted one).")
    assert demo.predicted_vs_achieved({"runs": report["runs"][:1]}) == ""  # the tuned run is missing


def _printed_without_the_venv_on_path(logdir: str) -> tuple[str, dict]:
    """The command the demo prints in a shell whose PATH holds no `tensorboard`, and that shell's environment."""
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    assert shutil.which("tensorboard", path=env["PATH"]) is None
    code = f"from rnnmon.demo import tensorboard_command; print(tensorboard_command({logdir!r}))"
    printed = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
    return printed, env


def test_the_tensorboard_command_finds_this_environments_where_tensorboard_is_not_on_path():
    """Issue 26: after the README's setup `tensorboard` is `.venv/bin/tensorboard`, not on PATH, yet the demo said
    `tensorboard --logdir runs`. A shell without the venv on PATH finds the printed program, and it is the
    `tensorboard` beside this Python (the slow test below runs it)."""
    printed, env = _printed_without_the_venv_on_path("my runs")
    assert printed.endswith(" --logdir 'my runs'") and printed != "tensorboard --logdir 'my runs'", printed
    program = shlex.split(printed)[0]
    found = subprocess.run(["sh", "-c", f"command -v {shlex.quote(program)}"], env=env, cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
    beside = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    assert os.access(os.path.join(ROOT, found), os.X_OK) and os.path.samefile(os.path.join(ROOT, found), beside)


@pytest.mark.slow
def test_the_tensorboard_command_runs_where_tensorboard_is_not_on_path():
    """The printed command is run as printed, from a shell without the venv on PATH (TensorBoard imports
    TensorFlow: 6 s of CPU)."""
    printed, env = _printed_without_the_venv_on_path("my runs")
    ran = subprocess.run(f"{printed} --version_tb", shell=True, env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0 and ran.stdout.strip()[:1].isdigit(), (printed, ran.stdout, ran.stderr[-2000:])


def test_the_tensorboard_command_is_plain_where_path_finds_this_environments():
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    code = "from rnnmon.demo import tensorboard_command; print(tensorboard_command('runs'))"
    printed = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
    assert printed == "tensorboard --logdir runs"
