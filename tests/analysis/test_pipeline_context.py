"""Pipeline warnings are read against the run: info where the steps hardly waited for input.

Field trial (keras-io IMDB example, docs/field-trial.md): a generator or a one-worker PyDataset got a
DATA_NOT_TF warning in runs whose input wait was 0.1-1.8% of the time, under the summary "input and host
overhead are small".
"""

from __future__ import annotations

import time

import pytest
from conftest import read_run, sequences, tiny_model

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize

BATCHES = 24


def _batches(stall_s: float):
    for index in range(BATCHES):
        time.sleep(stall_s)
        yield sequences(1, seed=index % 4)


@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize(("stall_s", "severity"), [(0.0, "info"), (0.03, "warning")])
def test_data_not_tf_is_a_warning_only_where_the_steps_waited(tmp_path, stall_s, severity):
    tiny_model(units=128).fit(_batches(stall_s), steps_per_epoch=BATCHES, epochs=1, verbose=0,
                              callbacks=[UtilizationMonitor(str(tmp_path))])
    summary = summarize(read_run(str(tmp_path)))
    [finding] = [f for f in summary["findings"] if f["code"] == "DATA_NOT_TF"]
    assert finding["severity"] == severity, (summary["shares"], summary["verdict"])
    assert ("In this run the steps waited for input" in finding["message"]) is (severity == "info")
