"""How long the other callbacks' batch hooks took per step (one batch), over every fit of a run that timed them.

Each fit's last run description holds the seconds its callbacks' batch hooks took (`callback_hooks_s`, by
class name) and the batches that time covers (`callback_batches`; the hooks run once per execution of
`steps_per_execution` batches). Both are summed over the fits, so an interrupted fit and its re-run in one
`log_dir` give the true time per batch; a fit that never wrote them (killed outright) is in neither sum. A fit
written before `callback_batches` existed counts its `callback_steps` (executions) times its
`steps_per_execution`; one written before `callback_steps` keeps the old reading: its latest fit's seconds over
all the run's batches.

Example:
    >>> callback_ms_per_step(run, int(run.steps[:, 6].sum()))
    {'Sleeper': 50.21, 'History': 0.0021}
    >>> callback_hooks_s(run, int(run.steps[:, 6].sum()))   # the same time in seconds, summed over the fits
    {'Sleeper': 15.063, 'History': 0.0006}
"""

from __future__ import annotations

from typing import Any

from rnnmon.format.reader import RunData


def callback_ms_per_step(run: RunData, batches: int) -> dict[str, float]:
    """Milliseconds per batch in each callback class's batch hooks; {} where no fit timed them (`batches`: the
    run's batches, for fits that did not say how many they timed)."""
    seconds, steps = _totals(run, batches)
    return {name: round(1e3 * total / max(steps, 1), 4) for name, total in seconds.items()}


def callback_hooks_s(run: RunData, batches: int) -> dict[str, float]:
    """Seconds in each callback class's batch hooks, summed over the fits that timed them; {} where none did."""
    return {name: round(total, 4) for name, total in _totals(run, batches)[0].items()}


def _totals(run: RunData, batches: int) -> tuple[dict[str, float], int]:
    """Seconds per callback class over the fits that timed them, and the batches that time covers."""
    timed = [info for info in run.fit_infos if isinstance(info.get("callback_hooks_s"), dict)]
    if all("callback_steps" in info for info in timed):
        steps = sum(_batches(info) for info in timed)
    else:
        timed, steps = timed[-1:], batches
    totals: dict[str, float] = {}
    for info in timed:
        for name, seconds in _numbers(info["callback_hooks_s"]).items():
            totals[name] = totals.get(name, 0.0) + seconds
    return totals, steps


def _batches(info: dict[str, Any]) -> int:
    """The batches a fit's callback time covers (its executions times their batches, where it did not say)."""
    if "callback_batches" in info:
        return int(info["callback_batches"])
    return int(info["callback_steps"]) * max(int(info.get("steps_per_execution") or 1), 1)


def _numbers(hooks: dict[str, Any]) -> dict[str, float]:
    return {str(name): float(seconds) for name, seconds in hooks.items()
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)}
