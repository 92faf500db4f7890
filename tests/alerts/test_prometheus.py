"""The Prometheus endpoint, scraped for real during a fit, against the names docs/prometheus.md promises."""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import subprocess
import sys
import urllib.request

import keras
import pytest
from conftest import ROOT, read_run, stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed

from rnnmon import UtilizationMonitor

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

DOCS = os.path.join(ROOT, "docs", "prometheus.md")


def documented_metrics() -> dict[str, str]:
    """name → type, from the metric table of docs/prometheus.md."""
    with open(DOCS, encoding="utf-8") as file:
        rows = re.findall(r"^\| `(rnnmon_\w+)(?:\{[^`]*\})?` \| (\w+) \|", file.read(), re.MULTILINE)
    return dict(rows)


def scrape(port: int) -> dict[str, list]:
    """Family name → samples, parsed with prometheus_client's own text parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {family.name: list(family.samples) for family in text_string_to_metric_families(text)}


def total(families: dict[str, list], sample_name: str, **labels: str) -> float:
    family = families[re.sub(r"_(total|count|sum|bucket)$", "", sample_name)]
    return sum(s.value for s in family if s.name == sample_name and labels.items() <= s.labels.items())


class ScrapeDuringFit(keras.callbacks.Callback):
    def __init__(self, monitor: UtilizationMonitor, at_batch: int) -> None:
        super().__init__()
        self.monitor, self.at_batch, self.families = monitor, at_batch, None

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.at_batch:
            self.families = scrape(self.monitor.prometheus_port)


@pytest.mark.slow
def test_endpoint_during_a_fit_has_every_documented_name_and_counters_grow(tmp_path, rnnmon_warnings):
    documented = documented_metrics()
    assert len(documented) == 12, documented
    half_idle = FakeGpu(utilization=lambda t: 0.0 if t % 0.6 < 0.3 else 90.0, pids=[os.getpid()])
    with installed(FakeNvmlLib([half_idle])):
        monitor = UtilizationMonitor(str(tmp_path), prometheus_port=0, prometheus_job="sweep", flush_secs=0.3,
                                     sample_interval_s=0.1)
        scraper = ScrapeDuringFit(monitor, at_batch=100)
        tiny_model().fit(stalled_dataset(200, 0.01, prefetch="none"), epochs=1, verbose=0, callbacks=[monitor, scraper])
    during, after = scraper.families, scrape(monitor.prometheus_port)
    assert f"rnnmon: Prometheus metrics at http://127.0.0.1:{monitor.prometheus_port}/metrics" in rnnmon_warnings()
    assert during is not None
    names = {sample.name for samples in after.values() for sample in samples}
    for name, kind in documented.items():
        expected = {"histogram": [f"{name}_bucket", f"{name}_sum", f"{name}_count"]}.get(kind, [name])
        assert set(expected) <= names, (name, sorted(names))
    for samples in after.values():
        for sample in samples:
            assert sample.labels["job"] == "sweep" and sample.labels["worker"] == "0", sample
    for counter in ("rnnmon_steps_total", "rnnmon_step_seconds_count", "rnnmon_input_wait_seconds_sum",
                    "rnnmon_host_gap_seconds_count", "rnnmon_gpu_idle_seconds_total"):
        assert 0 < total(during, counter) < total(after, counter), counter
    assert total(after, "rnnmon_steps_total") == 200
    latest = total(after, "rnnmon_gpu_utilization_ratio", gpu="0")  # a driver sample, as a ratio: 0% or 90%
    assert latest == 0.0 or latest == pytest.approx(0.9), latest
    verdicts = {s.labels["verdict"]: s.value for s in after["rnnmon_verdict"]}
    assert sum(verdicts.values()) == 1 and verdicts["input-bound"] == 1, verdicts  # a 10 ms stall, not overlapped
    assert {s.labels["rule"] for s in after["rnnmon_alert_firing"]} >= {"gpu_util_low", "input_wait_high"}
    assert read_run(str(tmp_path)).steps.shape[0] == 200  # the run is written as without the exporter


def test_port_in_use_is_one_error_line_and_training_goes_on(tmp_path, caplog, traced_model):
    caplog.set_level(logging.INFO, logger="rnnmon")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monitor = UtilizationMonitor(str(tmp_path), prometheus_port=port)
        traced_model.fit(stalled_dataset(20), epochs=1, verbose=0, callbacks=[monitor])
    errors = [r.getMessage() for r in caplog.records if r.name == "rnnmon" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0] and "unexported" in errors[0], errors
    assert monitor.prometheus_port is None
    assert read_run(str(tmp_path)).steps.shape[0] == 20


def test_the_exporter_keeps_the_reader_out_of_the_training_process():
    code = ("import sys, rnnmon.alerts.prometheus; "
            "print(sorted(m for m in ('rnnmon.format.reader', 'rnnmon.analysis.summary') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(("floor_s", "expected"), [(0.0, "input-bound"), (0.0019, "compute-bound")])
def test_the_live_verdict_counts_only_the_wait_beyond_the_fetch_floor(floor_s, expected):
    # Under MirroredStrategy each ready batch costs the distributed iterator ~2 ms of a 3.5 ms step: its floor.
    from rnnmon.alerts.prometheus import PrometheusExporter

    exporter = PrometheusExporter()
    rows = [(k + 1, 0, 0.0035 * k, 0.0035 * (k + 1), 0.002, 0.0, 1) for k in range(40)]
    exporter.on_chunk({"steps": rows, "util": {}, "gaps": [], "fetch_floor_s": floor_s})
    labels = {"job": "rnnmon", "worker": "0", "verdict": expected}
    assert exporter.registry.get_sample_value("rnnmon_verdict", labels) == 1.0


def test_the_live_verdict_judges_a_sampled_wait_on_the_timed_executions():
    # steps_per_execution=8, one execution in 16 timed: 60 ms of its 80 ms waited, the others' wait unknown (NaN).
    from rnnmon.alerts.prometheus import PrometheusExporter

    exporter = PrometheusExporter()
    rows = [(8 * (k + 1), 0, 0.08 * k, 0.08 * (k + 1), 0.06 if k % 16 == 1 else float("nan"), 0.0, 8)
            for k in range(64)]
    exporter.on_chunk({"steps": rows, "util": {}, "gaps": [], "fetch_floor_s": 0.0})
    labels = {"job": "rnnmon", "worker": "0", "verdict": "input-bound"}
    assert exporter.registry.get_sample_value("rnnmon_verdict", labels) == 1.0


def test_the_live_verdict_counts_compiles_as_the_report_does():
    """Two steps in three compile for 0.5 s (a new sequence length under XLA): the median step is a compile."""
    from rnnmon.alerts.prometheus import PrometheusExporter

    exporter = PrometheusExporter()
    rows, compiles, now = [], [], 0.0
    for k in range(30):
        seconds = 0.502 if k % 3 != 2 else 0.002
        rows.append((k + 1, 0, now, now + seconds, 0.0, 0.0, 1))
        if seconds > 0.1:
            compiles.append((k + 1, 1, now, now + seconds, 1, float("nan"), "xla", None))
        now += seconds
    exporter.on_chunk({"steps": rows, "util": {}, "gaps": [], "compiles": compiles})
    labels = {"job": "rnnmon", "worker": "0", "verdict": "compile-bound"}
    assert exporter.registry.get_sample_value("rnnmon_verdict", labels) == 1.0


def test_the_warmup_is_flagged_and_its_gpu_samples_count_as_neither_busy_nor_sampled():
    """A 30 s first step at 0% (tracing, compiling), then 90%: busy over sampled reads 90%, as rnnmon judges."""
    from rnnmon.alerts.prometheus import PrometheusExporter

    exporter = PrometheusExporter()
    exporter.add_devices([0])
    exporter.fit_started()
    labels = {"job": "rnnmon", "worker": "0"}
    compiling = [(0.5 * k, 0.0) for k in range(40)]  # before the warm-up step is recorded
    exporter.on_chunk({"steps": [], "util": {0: compiling}, "gaps": []})
    assert exporter.registry.get_sample_value("rnnmon_warmup", labels) == 1.0
    warmup = (1, 0, 0.0, 30.0, math.nan, math.nan, 1)
    steps = [(k + 2, 0, 30.0 + k, 31.0 + k, 0.0, 0.0, 1) for k in range(20)]
    exporter.on_chunk({"steps": [warmup, *steps], "util": {0: [(0.5 * k, 0.0 if k < 60 else 90.0)
                                                               for k in range(40, 100)]}, "gaps": []})
    assert exporter.registry.get_sample_value("rnnmon_warmup", labels) == 0.0
    busy = exporter.registry.get_sample_value("rnnmon_gpu_busy_seconds_total", {**labels, "gpu": "0"})
    sampled = exporter.registry.get_sample_value("rnnmon_gpu_sampled_seconds_total", {**labels, "gpu": "0"})
    assert sampled == pytest.approx(20.0) and busy / sampled == pytest.approx(0.9)
    exporter.fit_ended()
    assert exporter.registry.get_sample_value("rnnmon_warmup", labels) == 0.0
