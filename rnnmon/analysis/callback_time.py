"""How long the other callbacks' batch hooks took per step, over every fit of a run that timed them.

Each fit's last run description holds the seconds its callbacks' batch hooks took (`callback_hooks_s`, by
class name) and the steps that time covers (`callback_steps`). Both are summed over the fits, so an
interrupted fit and its re-run in one `log_dir` give the true time per step; a fit that never wrote them
(killed outright) is in neither sum. A run written before `callback_steps` existed keeps the old reading: its
latest fit's seconds over all the run's steps.

Example:
    >>> callback_ms_per_step(run, len(run.steps))
    {'Sleeper': 50.21, 'History': 0.0021}
    >>> callback_hooks_s(run, len(run.steps))               # the same time in seconds, summed over the fits
    {'Sleeper': 15.063, 'History': 0.0006}
"""

from __future__ import annotations

from typing import Any

from rnnmon.format.reader import RunData


def callback_ms_per_step(run: RunData, step_rows: int) -> dict[str, float]:
    """Milliseconds per step in each callback class's batch hooks; {} where no fit timed them (`step_rows`: the
    run's step records, for fits that did not say how many steps they timed)."""
    seconds, steps = _totals(run, step_rows)
    return {name: round(1e3 * total / max(steps, 1), 4) for name, total in seconds.items()}


def callback_hooks_s(run: RunData, step_rows: int) -> dict[str, float]:
    """Seconds in each callback class's batch hooks, summed over the fits that timed them; {} where none did."""
    return {name: round(total, 4) for name, total in _totals(run, step_rows)[0].items()}


def _totals(run: RunData, step_rows: int) -> tuple[dict[str, float], int]:
    """Seconds per callback class over the fits that timed them, and the steps that time covers."""
    timed = [info for info in run.fit_infos if isinstance(info.get("callback_hooks_s"), dict)]
    if all("callback_steps" in info for info in timed):
        steps = sum(info["callback_steps"] for info in timed)
    else:
        timed, steps = timed[-1:], step_rows
    totals: dict[str, float] = {}
    for info in timed:
        for name, seconds in _numbers(info["callback_hooks_s"]).items():
            totals[name] = totals.get(name, 0.0) + seconds
    return totals, steps


def _numbers(hooks: dict[str, Any]) -> dict[str, float]:
    return {str(name): float(seconds) for name, seconds in hooks.items()
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)}
