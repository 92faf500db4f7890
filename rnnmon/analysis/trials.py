"""The trials of one KerasTuner search side by side: which were input-bound, and how much faster the fastest is.

A trial's run (`log_dir/trial_<id>/rnnmon`, see rnnmon.capture.trials) records its trial id, search (the tuner's
project name) and hyperparameters in its run description. Trials differ in batch size and model, so they are
compared on training time per epoch (wall time less warm-up, over the epochs run), not per step. A trial of
fewer than `MIN_RANKED_STEPS` steps after its warm-up (a Hyperband search's first rounds) is ranked with a caveat
that names it: over a few dozen steps, time per epoch is mostly epoch ends and noise.

Example:
    >>> groups = compare_trials([summarize(run) for run in runs.values()])
    >>> groups[0]["fastest"], groups[0]["speedup"], groups[0]["input_bound"]
    ('1', 2.4, ['0'])
"""

from __future__ import annotations

from typing import Any

MIN_RANKED_STEPS = 50  # steps after warm-up below which a trial's time per epoch is too noisy to rank it on


def compare_trials(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per search with two or more trial runs: a row per trial, the input-bound ones, the fastest and slowest, and
    a caveat (None when every ranked trial ran long enough)."""
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
                                 "input_bound": [row["trial"] for row in rows if row["verdict"] == "input-bound"],
                                 "caveat": None}
        if len(timed) >= 2:
            fast = min(timed, key=lambda row: row["epoch_s"])
            slow = max(timed, key=lambda row: row["epoch_s"])
            group.update(fastest=fast["trial"], slowest=slow["trial"],
                         speedup=round(slow["epoch_s"] / fast["epoch_s"], 2), caveat=_caveat(timed))
        groups.append(group)
    return groups


def _caveat(ranked: list[dict[str, Any]]) -> str | None:
    """What the ranking cannot tell: which ranked trials ran too few steps after their warm-up."""
    short = [row for row in ranked if row["steps"] < MIN_RANKED_STEPS]
    if not short:
        return None
    names = ", ".join(f"trial {row['trial']} ({row['steps']})" for row in short)
    return (f"ranked on too few steps: {names} ran fewer than {MIN_RANKED_STEPS} steps after warm-up, where time "
            "per epoch is mostly epoch ends and noise; compare trials that trained longer (a Hyperband search's "
            "last round), or give every trial more steps.")


def _row(trial: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    epochs = summary.get("epochs") or 0
    hyperparameters = trial.get("hyperparameters")
    return {"trial": trial["id"], "run": summary["run"], "verdict": summary["verdict"],
            "hyperparameters": hyperparameters if isinstance(hyperparameters, dict) else {},
            "steps": max(0, summary["steps"] - summary.get("fits", 0)),  # after each fit's warm-up step
            "epochs": epochs, "epoch_s": round(summary["wall_s"] / epochs, 4) if epochs else None,
            "step_ms": summary["step_ms"]["median"], "input_share": (summary.get("shares") or {}).get("input")}
