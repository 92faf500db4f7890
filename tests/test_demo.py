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
