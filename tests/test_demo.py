"""`rnnmon demo`'s two pipelines and its closing line, without its two fits (those run in tests/tab and
tests/analysis/test_speedup_prediction.py, in the full suite).
"""

from __future__ import annotations

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


def test_the_closing_line_puts_the_prediction_beside_the_speedup_achieved():
    def run(name, median_ms, findings):
        return {"run": f"{name}/rnnmon", "step_ms": {"median": median_ms}, "findings": findings}

    bound = {"code": "INPUT_BOUND", "speedup": 2.6}
    report = {"runs": [run("input_bound", 31.0, [{"code": "PIPELINE_SERIAL_MAP"}, bound]), run("tuned", 10.0, [])]}
    assert demo.predicted_vs_achieved(report) == (
        "\nPredicted by INPUT_BOUND: up to 2.6x shorter steps; achieved by the tuned run: 3.1x shorter median step.")
    report["runs"][0]["findings"] = []
    assert demo.predicted_vs_achieved(report) == (
        "\nAchieved: 3.1x shorter median step (no measured finding predicted one).")
    assert demo.predicted_vs_achieved({"runs": report["runs"][:1]}) == ""  # the tuned run is missing
