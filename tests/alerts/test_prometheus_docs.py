"""The files docs/prometheus.md ships for a fleet: alerting rules and a Grafana dashboard, checked as shipped."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from test_prometheus import documented_metrics

from rnnmon.alerts.thresholds import Thresholds

yaml = pytest.importorskip("yaml")
DOCS = os.path.join(ROOT, "docs")
RULES = os.path.join(DOCS, "prometheus-rules.yml")
FAST = os.path.join(DOCS, "prometheus-rules-fast.yml")
_DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")
_SECONDS = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\brnnmon_\w+", expr)) - {"rnnmon_rule"}


def known(name: str) -> bool:
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return name in documented_metrics() or base in documented_metrics()


def load_rules(path: str = RULES) -> list[dict]:
    with open(path, encoding="utf-8") as file:
        document = yaml.safe_load(file)
    assert set(document) == {"groups"} and isinstance(document["groups"], list)
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_page_carries_the_rules_file_verbatim():
    with open(os.path.join(DOCS, "prometheus.md"), encoding="utf-8") as page, open(RULES, encoding="utf-8") as rules:
        assert rules.read() in page.read()


@pytest.mark.parametrize("path", [RULES, FAST], ids=["default", "fast"])
def test_rules_parse_with_promtool_or_the_schema(path):
    promtool = shutil.which("promtool", path=os.path.dirname(sys.executable)) or shutil.which("promtool")
    if promtool:
        result = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
    for rule in load_rules(path):  # the schema promtool checks, as far as it can be checked without it
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"])
        assert _DURATION.match(rule["for"]), rule["for"]
        assert all(isinstance(v, str) for v in (*rule["labels"].values(), *rule["annotations"].values()))
        assert rule["expr"].count("(") == rule["expr"].count(")")
        names = metric_names(rule["expr"])
        assert names and all(known(name) for name in names), names


def test_rules_mirror_the_default_thresholds():
    defaults = Thresholds()
    rules = {rule["labels"]["rnnmon_rule"]: rule for rule in load_rules() if "rnnmon_rule" in rule["labels"]}
    enabled = {name for name, group in defaults.to_dict().items() if group["enabled"]}
    assert set(rules) == enabled
    for name, rule in rules.items():
        group = getattr(defaults, name)
        number, unit = _DURATION.match(rule["for"]).groups()
        if hasattr(group, "for_s") and "rnnmon_alert_firing" not in rule["expr"]:  # judged by Prometheus
            assert int(number) * _SECONDS[unit] == group.for_s, name
    assert "< 0.20" in rules["gpu_util_low"]["expr"] and defaults.gpu_util_low.pct == 20
    assert "> 0.20" in rules["input_wait_high"]["expr"] and defaults.input_wait_high.pct == 20
    assert ">= 10" in rules["idle_gap"]["expr"] and defaults.idle_gap.min_s == 10
    assert "1.5 *" in rules["step_time_regression"]["expr"] and defaults.step_time_regression.ratio == 1.5


def test_grafana_dashboard_queries_only_documented_metrics():
    with open(os.path.join(DOCS, "grafana-dashboard.json"), encoding="utf-8") as file:
        dashboard = json.load(file)
    assert dashboard["title"] and dashboard["panels"]
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = set().union(*(metric_names(expr) for expr in exprs))
    assert all(known(name) for name in used), used
    panel_ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(panel_ids) == len(set(panel_ids))
    for expr in exprs:
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


@pytest.mark.parametrize("path", [RULES, FAST], ids=["default", "fast"])
def test_every_rule_holds_only_while_training_runs_past_its_warmup(path):
    for rule in load_rules(path):
        assert " ".join(rule["expr"].split()).endswith(
            "and on (job, worker) rnnmon_training == 1 and on (job, worker) rnnmon_warmup == 0"), rule["alert"]
        if "rnnmon_gpu_idle_seconds_total" in rule["expr"]:  # the warm-up's idle gap is tracing, not a finding
            assert 'rnnmon_gpu_idle_seconds_total{cause!="warmup"}' in rule["expr"], rule["alert"]


@pytest.mark.parametrize("path", [RULES, FAST], ids=["default", "fast"])
def test_no_rule_judged_by_prometheus_fires_on_one_evaluation(path):
    """`for: 0s` only where no noise can trip it: a closed idle gap of 10 s, or a judgement rnnmon held 30 s."""
    for rule in load_rules(path):
        if rule["for"] == "0s":
            assert rule["labels"].get("rnnmon_rule") == "idle_gap" or "rnnmon_alert_firing" in rule["expr"], \
                rule["alert"]


def test_gpu_util_low_judges_the_windowed_mean_not_the_latest_sample():
    for path in (RULES, FAST):
        rule = next(r for r in load_rules(path) if r["labels"]["rnnmon_rule"] == "gpu_util_low")
        assert "rnnmon_gpu_utilization_ratio" not in rule["expr"]
        assert re.search(r"rate\(rnnmon_gpu_busy_seconds_total\[\w+\]\) / rate\(rnnmon_gpu_sampled_seconds_total",
                         rule["expr"]), rule["expr"]


def test_the_fast_profile_is_the_default_rules_judged_over_the_rnnmon_windows():
    defaults = Thresholds()
    default = {rule["alert"]: rule for rule in load_rules(RULES)}
    fast = {rule["alert"]: rule for rule in load_rules(FAST)}
    assert list(fast) == list(default)
    for name, rule in fast.items():
        assert rule["labels"] == default[name]["labels"], name
        if "rnnmon_rule" not in rule["labels"]:  # a finding across workers (STRAGGLER): over the shortest window
            assert rule["expr"] == default[name]["expr"].replace("[1m]", "[30s]") and rule["for"] == "10s", name
            continue
        group = getattr(defaults, rule["labels"]["rnnmon_rule"])
        if "[1m]" in default[name]["expr"] and hasattr(group, "for_s"):  # a windowed rule judged by Prometheus
            window = f"[{int(group.for_s)}s]" if group.for_s < 60 else f"[{int(group.for_s) // 60}m]"
            assert rule["expr"] == default[name]["expr"].replace("[1m]", window), name
            assert rule["for"] == ("0s" if name == "RnnmonIdleGap" else "10s"), name  # three evaluations agree
        else:
            assert (rule["expr"], rule["for"]) == (default[name]["expr"], default[name]["for"]), name
    with open(os.path.join(DOCS, "prometheus.md"), encoding="utf-8") as page:
        assert "docs/prometheus-rules-fast.yml" in page.read()


def test_every_dashboard_legend_names_the_job():
    with open(os.path.join(DOCS, "grafana-dashboard.json"), encoding="utf-8") as file:
        dashboard = json.load(file)
    legends = [target["legendFormat"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert legends and all("{{job}}" in legend for legend in legends), legends


def test_the_created_series_are_documented():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from rnnmon.alerts.prometheus import PrometheusExporter

    exporter = PrometheusExporter()
    exporter.add_devices([0])
    created = set(re.findall(r"^(rnnmon_\w+)_created\{", generate_latest(exporter.registry).decode(), re.MULTILINE))
    assert created
    with open(os.path.join(DOCS, "prometheus.md"), encoding="utf-8") as page:
        text = page.read()
    assert "`<name>_created`" in text
    assert all(f"`{name}_total" in text or f"`{name}_total{{" in text for name in created), created


def test_every_exported_series_feeds_a_documented_served_metric():
    """`Series.exported` in rnnmon/format/series.py names the metric each recorded series feeds: each is in the
    metric table of docs/prometheus.md and in an exporter's registry."""
    from rnnmon.alerts.prometheus import PrometheusExporter
    from rnnmon.format import series

    served = {family.name + ("_total" if family.type == "counter" else "")
              for family in PrometheusExporter(job="docs").registry.collect()}
    exported = set(series.exported())
    assert "rnnmon_gpu_utilization_ratio" in exported and exported <= served and exported <= set(documented_metrics())
