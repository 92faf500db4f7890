"""`model.evaluate()` and `predict()` given the monitor outside `fit`: not recorded, and said so once.

Field trial (issue 26): both ran with the monitor as a callback, recorded nothing and said nothing.
"""

from __future__ import annotations

import pytest
from conftest import read_run, sequences, tiny_model

from rnnmon import UtilizationMonitor

NOT_RECORDED = "evaluate() and predict() outside fit() are not recorded"


@pytest.mark.usefixtures("no_nvml")
def test_evaluate_and_predict_outside_fit_are_named_once(tmp_path, rnnmon_warnings, traced_model):
    x, y = sequences(4)
    model, monitor = traced_model, UtilizationMonitor(str(tmp_path), audit=False)
    model.fit(x[:64], y[:64], validation_data=(x[64:], y[64:]), epochs=1, batch_size=32, verbose=0,
              callbacks=[monitor])
    assert not _named(rnnmon_warnings())  # validation inside fit is recorded: nothing to say
    model.evaluate(x, y, batch_size=32, verbose=0, callbacks=[monitor])
    model.predict(x, batch_size=32, verbose=0, callbacks=[monitor])
    model.evaluate(x, y, batch_size=32, verbose=0, callbacks=[monitor])
    warnings = _named(rnnmon_warnings())
    assert len(warnings) == 1 and "model.evaluate() was given this monitor" in warnings[0], warnings
    assert NOT_RECORDED in warnings[0]
    assert read_run(str(tmp_path)).steps.shape[0] == 2  # the fit's two steps, nothing from evaluate()


@pytest.mark.usefixtures("no_nvml")
def test_predict_before_any_fit_is_named(tmp_path, rnnmon_warnings):
    x, _ = sequences(2)
    tiny_model().predict(x, batch_size=32, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path), audit=False)])
    warnings = _named(rnnmon_warnings())
    assert len(warnings) == 1 and "model.predict() was given this monitor" in warnings[0], warnings


def _named(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "was given this monitor" in w]
