"""`RnnmonStraggler` in docs/prometheus-rules.yml, evaluated by promtool's rule engine on the exported series.

Jobs scraped every 15 s at 10 steps a second with a 90 ms step, each worker's input waits all alike: two workers
of which one stalls 12 ms a batch beyond the other (13% of the job's step, as in a real 2-process JAX job), one
6 ms on a loaded machine where one step in ten takes 1 s (the report's share, beyond the median step: 6.6%; beyond
the mean step, 181 ms, it would be 3.3%), one 3 ms (3%), three workers of which one stalls 12 ms beyond the
others' median, and a job of one worker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

RULES = os.path.join(ROOT, "docs", "prometheus-rules.yml")
PROMTOOL = shutil.which("promtool", path=os.path.dirname(sys.executable)) or shutil.which("promtool")
STEPS_PER_SCRAPE, STEP_S, GAP_S = 150, 0.09, 0.0001


def _buckets(name: str, labels: str, shares: dict[float, float]) -> list[dict[str, str]]:
    """A histogram's buckets, each scrape's steps split as `shares` says ({value: share of the steps}): each value
    lies in the middle of a bucket 10% wide, so histogram_quantile reads it exactly."""
    bounds: list[tuple[float, float]] = [(0.0, 0.0)]
    for value, share in sorted(shares.items()):
        bounds += [(0.95 * value, bounds[-1][1]), (1.05 * value, bounds[-1][1] + share)]
    return [{"series": f'{name}_bucket{{{labels},le="{le}"}}', "values": f"0+{STEPS_PER_SCRAPE * share!r}x40"}
            for le, share in [*bounds[1:], ("+Inf", 1.0)]]


def _worker(job: str, worker: str, wait_s: float, steps: dict[float, float] | None = None) -> list[dict[str, str]]:
    """A worker's series, increasing by one scrape interval's steps each 15 s for 10 minutes."""
    labels = f'job="{job}",worker="{worker}"'
    return [*_buckets("rnnmon_step_seconds", labels, steps or {STEP_S: 1.0}),
            *_buckets("rnnmon_input_wait_seconds", labels, {wait_s: 1.0}),
            {"series": f"rnnmon_step_seconds_count{{{labels}}}", "values": f"0+{STEPS_PER_SCRAPE}x40"},
            {"series": f"rnnmon_host_gap_seconds_sum{{{labels}}}", "values": f"0+{STEPS_PER_SCRAPE * GAP_S!r}x40"},
            {"series": f"rnnmon_training{{{labels}}}", "values": "1x40"},  # a fit runs
            {"series": f"rnnmon_warmup{{{labels}}}", "values": "0x40"}]  # past its warm-up


def _alert(job: str, worker: str, share: float) -> dict:
    return {"exp_labels": {"alertname": "RnnmonStraggler", "severity": "page", "rnnmon_finding": "STRAGGLER",
                           "job": job, "worker": worker},
            "exp_annotations": {
                "summary": f"Worker {worker} holds back every worker of {job}",
                "description": f"Each step of the job waits for worker {worker}'s input wait and host gap beyond the "
                               f"other workers': {100 * share:.4g}% of the job's median step. Check that worker's "
                               "data source, CPU load and shard size; `rnnmon report` names the cause."}}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (.ci/setup takes it from Debian)")
def test_the_straggler_rule_pages_on_the_reports_share_across_the_worker_label(tmp_path):
    loaded = {STEP_S: 0.9, 1.0: 0.1}
    loaded_step = 0.95 * STEP_S + 0.1 * STEP_S * 0.5 / 0.9  # histogram_quantile's median: inside the 90 ms bucket
    series = [*_worker("stalled", "0", 0.0008), *_worker("stalled", "1", 0.0128),
              *_worker("loaded", "0", 0.0008, loaded), *_worker("loaded", "1", 0.0068, loaded),
              *_worker("level", "0", 0.0008), *_worker("level", "1", 0.0038),
              *_worker("three", "0", 0.0008), *_worker("three", "1", 0.0010), *_worker("three", "2", 0.0128),
              *_worker("alone", "0", 0.02)]
    test = {"rule_files": [RULES], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": series, "alert_rule_test": [
                {"eval_time": "45s", "alertname": "RnnmonStraggler", "exp_alerts": []},  # not for 1m yet
                {"eval_time": "5m", "alertname": "RnnmonStraggler", "exp_alerts": [
                    _alert("stalled", "1", 0.012 / STEP_S), _alert("loaded", "1", 0.006 / loaded_step),
                    _alert("three", "2", 0.0118 / STEP_S)]}]}]}
    path = tmp_path / "straggler_test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
