"""The trials of a KerasTuner search compared in the report (a real search: tests/capture/test_tuner.py)."""

from __future__ import annotations

from synthetic_runs import write_gpu_run

from rnnmon.report import build_report, render_text


def _trial(trial_id: str, search: str = "lstm", **values) -> dict:
    return {"trial": {"id": trial_id, "search": search, "hyperparameters": values}}


def test_trials_of_one_search_are_compared_and_other_runs_left_out(tmp_path):
    write_gpu_run(str(tmp_path / "trial_0" / "rnnmon"), chunks=20, wait_s=0.008, info=_trial("0", units=8))
    write_gpu_run(str(tmp_path / "trial_1" / "rnnmon"), chunks=20, steps_per_chunk=2, wait_s=0.0002,
                  info=_trial("1", units=32))
    write_gpu_run(str(tmp_path / "other" / "trial_0" / "rnnmon"), chunks=20, info=_trial("0", search="alone"))
    write_gpu_run(str(tmp_path / "plain" / "rnnmon"), chunks=20)
    report = build_report(str(tmp_path))
    [group] = report["trials"]  # a search with one trial has nothing to compare; a plain run is no trial
    assert group["search"] == "lstm" and [row["trial"] for row in group["trials"]] == ["0", "1"]
    assert group["input_bound"] == ["0"]
    assert [row["hyperparameters"] for row in group["trials"]] == [{"units": 8}, {"units": 32}]
    rows = {row["trial"]: row for row in group["trials"]}
    assert rows["0"]["epochs"] == rows["1"]["epochs"] == 2
    # trial 1 runs two 20 ms steps per chunk where trial 0 runs five: less training time per epoch
    assert (group["fastest"], group["slowest"]) == ("1", "0")
    assert group["speedup"] == round(rows["0"]["epoch_s"] / rows["1"]["epoch_s"], 2) > 1.5
    text = render_text(report)
    assert "Trials of search lstm (2)" in text and "input-bound: trial 0\n" in text and "units=32" in text


def test_a_ranking_on_too_few_steps_says_so(tmp_path):
    write_gpu_run(str(tmp_path / "trial_0" / "rnnmon"), chunks=20, info=_trial("0", units=8))  # 100 steps
    write_gpu_run(str(tmp_path / "trial_1" / "rnnmon"), chunks=4, steps_per_chunk=3, info=_trial("1", units=32))
    [group] = build_report(str(tmp_path))["trials"]
    assert [row["steps"] for row in group["trials"]] == [99, 11]  # after the warm-up step
    assert group["caveat"].startswith("ranked on too few steps: trial 1 (11) ran fewer than 50 steps after warm-up")
    assert f"  caveat: {group['caveat']}" in render_text(build_report(str(tmp_path)))


def test_trials_that_ran_long_enough_are_ranked_without_a_caveat(tmp_path):
    for trial_id in ("0", "1"):
        write_gpu_run(str(tmp_path / f"trial_{trial_id}" / "rnnmon"), chunks=12, info=_trial(trial_id))
    [group] = build_report(str(tmp_path))["trials"]
    assert group["fastest"] is not None and group["caveat"] is None
    assert "caveat" not in render_text(build_report(str(tmp_path)))
