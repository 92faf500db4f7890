"""A pipeline that caches: its first epoch fills the cache and waits, and is judged apart from the epochs after it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import read_run, stalled_dataset

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize
from rnnmon.format import schema

_S = {name: i for i, name in enumerate(schema.STEP_COLUMNS)}


@pytest.mark.usefixtures("no_nvml")
def test_the_first_epoch_filling_the_cache_is_a_note_not_input_bound(tmp_path, traced_models):
    data = stalled_dataset(12, 0.06).cache()  # a 60 ms Python stage before the cache: the first epoch only
    model = traced_models(device_s=0.02)  # a 20 ms step: reading the cache (~0.5 ms) stays far under 5% of it
    model.fit(data, epochs=3, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
    run = read_run(str(tmp_path))
    assert run.info["input_cache"] == "input pipeline/CacheDataset[4]"
    steps = run.steps[~np.isnan(run.steps[:, _S["host_gap_ms"]])]
    wait_ms = {epoch: np.median(steps[steps[:, _S["epoch"]] == epoch, _S["input_wait_ms"]]) for epoch in (0, 1, 2)}
    assert wait_ms[0] > 10 and wait_ms[1] < 5 and wait_ms[2] < 5, wait_ms  # the fit did what this test is about

    summary = summarize(run)
    assert summary["verdict"] != "input-bound"
    assert summary["cache_fill"]["steps"] == 11 and summary["cache_fill"]["input_share"] >= 0.2  # less warm-up
    findings = {f["code"]: f for f in summary["findings"]}
    assert "INPUT_BOUND" not in findings, findings["INPUT_BOUND"]
    note = findings["CACHE_FILL"]
    assert note["severity"] == "info" and note["where"] == "input pipeline/CacheDataset[4]"
    assert "The first epoch waited" in note["message"] and "`.cache()`" in note["message"]
    assert note["speedup"] > 1
    assert summary["summary"].startswith("Once the first epoch had filled the cache")
    stage = findings["PIPELINE_PY_FUNCTION"]  # it runs before the cache: it cost the first epoch only
    assert stage["severity"] == "info" and "the first epoch, filling it, waited" in stage["message"]
