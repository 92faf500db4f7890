"""The report's `Speedup:` line compares different runs: never a run with itself, never workers of one job."""

from __future__ import annotations

from synthetic_runs import write_gpu_run

from rnnmon.report import build_report, render_text


def _report(tmp_path, runs: dict[str, float]) -> tuple[dict, str]:
    for name, step_s in runs.items():
        write_gpu_run(str(tmp_path / name / "rnnmon"), chunks=6, step_s=step_s)
    report = build_report(str(tmp_path))
    return report["comparison"], render_text(report)


def test_runs_whose_medians_tie_get_no_speedup(tmp_path):
    # Before: "Speedup: a/rnnmon takes a 1.0x shorter median step than a/rnnmon." (max and min picked the same run)
    comparison, text = _report(tmp_path, {"a": 0.02, "b": 0.02})
    assert comparison is None and "Speedup:" not in text, text


def test_workers_of_one_job_are_not_compared_with_each_other(tmp_path):
    # Before: the workers of one synchronous job, which share every step, were "1.5x shorter" than each other.
    comparison, text = _report(tmp_path, {"job/worker-0": 0.02, "job/worker-1": 0.03, "job/chief-0": 0.02})
    assert comparison is None and "Speedup:" not in text, text
    assert "Workers of job (3)" in text


def test_a_job_is_compared_with_other_runs_as_one(tmp_path):
    comparison, text = _report(tmp_path, {"job/worker-0": 0.04, "job/worker-1": 0.04, "tuned": 0.02,
                                          "worker-0": 0.06, "worker-1": 0.06})
    assert comparison == {"slowest": "./* (2 workers)", "fastest": "tuned/rnnmon", "speedup": 3.0}, comparison
    assert "Speedup: tuned/rnnmon takes a 3.0x shorter median step than ./* (2 workers)." in text
    comparison, _ = _report(tmp_path / "two", {"job/worker-0": 0.04, "job/worker-1": 0.04, "tuned": 0.02})
    assert comparison == {"slowest": "job/* (2 workers)", "fastest": "tuned/rnnmon", "speedup": 2.0}, comparison
