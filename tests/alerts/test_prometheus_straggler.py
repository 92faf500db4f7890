"""`RnnmonStraggler` in docs/prometheus-rules.yml, evaluated by promtool's rule engine on the exported series.

Two-worker jobs scraped every 15 s at 10 steps a second with a 90 ms step: one worker stalls 12 ms a batch beyond
the other (13% of the job's step, as in a real 2-process JAX job), one 3 ms (3%), and a job of one worker.
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


def _worker(job: str, worker: str, wait_s: float) -> list[dict[str, str]]:
    """A worker's counters, increasing by one scrape interval's steps each 15 s for 10 minutes."""
    per_scrape = {"rnnmon_step_seconds_count": STEPS_PER_SCRAPE, "rnnmon_step_seconds_sum": STEPS_PER_SCRAPE * STEP_S,
                  "rnnmon_input_wait_seconds_sum": STEPS_PER_SCRAPE * wait_s,
                  "rnnmon_host_gap_seconds_sum": STEPS_PER_SCRAPE * GAP_S}
    return [*({"series": f'{name}{{job="{job}",worker="{worker}"}}', "values": f"0+{increase!r}x40"}
              for name, increase in per_scrape.items()),
            {"series": f'rnnmon_training{{job="{job}",worker="{worker}"}}', "values": "1x40"},  # a fit runs
            {"series": f'rnnmon_warmup{{job="{job}",worker="{worker}"}}', "values": "0x40"}]  # past its warm-up


def _alert(job: str, worker: str, share: str) -> dict:
    return {"exp_labels": {"alertname": "RnnmonStraggler", "severity": "page", "rnnmon_finding": "STRAGGLER",
                           "job": job, "worker": worker},
            "exp_annotations": {
                "summary": f"Worker {worker} holds back every worker of {job}",
                "description": f"Each step of the job waits for worker {worker}'s input wait and host gap beyond the "
                               f"least-stalled worker's: {share} of the job's step. Check that worker's data "
                               "source, CPU load and shard size; `rnnmon report` names the cause."}}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (.ci/setup takes it from Debian)")
def test_the_straggler_rule_pages_on_a_12ms_stall_across_the_worker_label(tmp_path):
    series = [*_worker("stalled", "0", 0.0008), *_worker("stalled", "1", 0.0128),
              *_worker("level", "0", 0.0008), *_worker("level", "1", 0.0038), *_worker("alone", "0", 0.02)]
    test = {"rule_files": [RULES], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": series, "alert_rule_test": [
                {"eval_time": "45s", "alertname": "RnnmonStraggler", "exp_alerts": []},  # not for 1m yet
                {"eval_time": "5m", "alertname": "RnnmonStraggler",
                 "exp_alerts": [_alert("stalled", "1", "13.33%")]}]}]}
    path = tmp_path / "straggler_test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
