"""The trials of one KerasTuner search side by side: which were input-bound, and how much faster the fastest is.

A trial's run (`log_dir/trial_<id>/rnnmon`, see rnnmon.capture.trials) records its trial id, search (the tuner's
project name) and hyperparameters in its run description. Trials differ in batch size and model, so they are
compared on training time per epoch (wall time less warm-up, over the epochs run), not per step.

Example:
    >>> groups = compare_trials([summarize(run) for run in runs.values()])
    >>> groups[0]["fastest"], groups[0]["speedup"], groups[0]["input_bound"]
    ('1', 2.4, ['0'])
"""

from __future__ import annotations

from typing import Any


def compare_trials(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per search with two or more trial runs: a row per trial, the input-bound ones, the fastest and slowest."""
    searches: dict[str, list[dict[str, Any]]] = {}
    for summary in summaries:
        trial = summary.get("trial")
        if isinstance(trial, dict) and isinstance(trial.get("id"), str):
            searches.setdefault(str(trial.get("search", "")), []).append(_row(trial, summary))
    groups = []
    for search, rows in sorted(searches.items()):
        if len(rows) < 2:
            continue
        rows.sort(key=lambda row: (len(row["trial"]), row["trial"], row["run"]))
        timed = [row for row in rows if row["epoch_s"] and row["verdict"] != "insufficient-data"]
        group: dict[str, Any] = {"search": search, "trials": rows, "fastest": None, "slowest": None, "speedup": None,
                                 "input_bound": [row["trial"] for row in rows if row["verdict"] == "input-bound"]}
        if len(timed) >= 2:
            fast = min(timed, key=lambda row: row["epoch_s"])
            slow = max(timed, key=lambda row: row["epoch_s"])
            group.update(fastest=fast["trial"], slowest=slow["trial"],
                         speedup=round(slow["epoch_s"] / fast["epoch_s"], 2))
        groups.append(group)
    return groups


def _row(trial: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    epochs = summary.get("epochs") or 0
    hyperparameters = trial.get("hyperparameters")
    return {"trial": trial["id"], "run": summary["run"], "verdict": summary["verdict"],
            "hyperparameters": hyperparameters if isinstance(hyperparameters, dict) else {},
            "epochs": epochs, "epoch_s": round(summary["wall_s"] / epochs, 4) if epochs else None,
            "step_ms": summary["step_ms"]["median"], "input_share": (summary.get("shares") or {}).get("input")}
