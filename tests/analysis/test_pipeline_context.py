"""Pipeline warnings are read against the run: info where the steps hardly waited for input.

Field trial (keras-io IMDB example, docs/field-trial.md): a generator or a one-worker PyDataset got a
DATA_NOT_TF warning in runs whose input wait was 0.1-1.8% of the time, under the summary "input and host
overhead are small".
"""

from __future__ import annotations

import time

import pytest
from conftest import read_run, sequences

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize

BATCHES = 16
DEVICE_S = 0.05  # a step of a small GPU model: the input pipeline works while the device computes


def _batches(stall_s: float):
    for index in range(BATCHES):
        time.sleep(stall_s)
        yield sequences(1, seed=index % 4)


# Without a stall the steps still wait 0.5-1 ms for each batch from a generator, loaded machine or not: a ready
# batch fetched right after a step costs 2-5x the fetch floor (measured back to back), and Dataset.from_generator's
# thread takes the GIL to refill its buffer as the step returns. Against a CPU-only 8 ms step that was 6-9% of step
# time, over the 5% where the warning becomes info; a step that waits for a device, as on a GPU, keeps it at 1-2%.
@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize(("stall_s", "severity"),
                         [(0.0, "info"), pytest.param(2 * DEVICE_S, "warning", marks=pytest.mark.slow)])
def test_data_not_tf_is_a_warning_only_where_the_steps_waited(tmp_path, traced_models, stall_s, severity):
    traced_models(device_s=DEVICE_S).fit(_batches(stall_s), steps_per_epoch=BATCHES, epochs=1, verbose=0,
                                         callbacks=[UtilizationMonitor(str(tmp_path))])
    summary = summarize(read_run(str(tmp_path)))
    [finding] = [f for f in summary["findings"] if f["code"] == "DATA_NOT_TF"]
    assert finding["severity"] == severity, (summary["shares"], summary["verdict"])
    assert ("In this run the steps waited for input" in finding["message"]) is (severity == "info")
