"""The KerasTuner trial a fit belongs to, so that each trial of a search writes a run of its own.

For every execution of a trial, KerasTuner's `Tuner.run_trial` deep-copies the callbacks given to `search` and
appends its own callback, which holds the `keras_tuner.engine.trial.Trial` (`trial_id`, `hyperparameters`) and
the tuner (`project_name`). The monitor finds it among its fit's callbacks at `on_train_begin` (reached through
the fit call, see `rnnmon.capture.fit_scope`). KerasTuner is looked at only if it is already imported.

Example:
    >>> tuner_trial(fit.callbacks.callbacks)
    Trial(id='01', search='lstm_units', hyperparameters={'units': 32})
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Trial:
    id: str  # KerasTuner's trial id: "00", "01", ...
    search: str  # the tuner's project name
    hyperparameters: dict[str, Any]  # the trial's values: numbers, strings and booleans

    @property
    def folder(self) -> str:
        """`trial_<id>`, as KerasTuner names its trial folders; characters unsafe in a folder name become `_`."""
        return "trial_" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.id)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tuner_trial(callbacks: Iterable[Any]) -> Trial | None:
    """The KerasTuner trial whose callback is among `callbacks`, or None outside a search."""
    keras_tuner = sys.modules.get("keras_tuner")
    if keras_tuner is None:
        return None
    for callback in callbacks:
        trial = getattr(callback, "trial", None)
        if isinstance(trial, keras_tuner.engine.trial.Trial):
            values = getattr(trial.hyperparameters, "values", {}) or {}
            return Trial(str(trial.trial_id), str(getattr(getattr(callback, "tuner", None), "project_name", "")),
                         {str(k): v for k, v in values.items() if isinstance(v, (bool, int, float, str))})
    return None
