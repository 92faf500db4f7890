"""A real Prometheus server (Debian's `prometheus` binary, taken by .ci/setup) scraping rnnmon during real fits.

Prometheus runs on 127.0.0.1 with a 1 s scrape and evaluation interval and docs/prometheus-rules-fast.yml as
shipped: its rules have `for: 0s`, and a rate needs two scrapes in its window, so they can fire seconds into a
fit, and each test takes well under a minute. Without the binary the tests skip.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import keras
import numpy as np
import pytest
from conftest import ROOT, read_run, stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed
from jax_job import JOB

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize

pytest.importorskip("prometheus_client")
yaml = pytest.importorskip("yaml")
BINARY = shutil.which("prometheus", path=os.path.dirname(sys.executable)) or shutil.which("prometheus")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(BINARY is None, reason="no prometheus binary (.ci/setup --test takes Debian's)")]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    """A Prometheus process scraping `target`, with the test copy of the fast rules; queried over its HTTP API."""

    def __init__(self, folder: str, target: int | None = None, sd_dir: str | None = None,
                 config: dict | None = None) -> None:
        if config is None:
            shutil.copy(os.path.join(ROOT, "docs", "prometheus-rules-fast.yml"), os.path.join(folder, "rules.yml"))
            targets = ({"file_sd_configs": [{"files": [f"{sd_dir}/*.json"]}]} if sd_dir else
                       {"static_configs": [{"targets": [f"127.0.0.1:{target}"]}]})
            config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                      "scrape_configs": [{"job_name": "rnnmon", "honor_labels": True, **targets}],
                      "rule_files": ["rules.yml"]}
        with open(os.path.join(folder, "prometheus.yml"), "w", encoding="utf-8") as file:
            json.dump(config, file)  # JSON is YAML
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(os.path.join(folder, "prometheus.log"), "w+b")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [BINARY, f"--config.file={folder}/prometheus.yml", f"--storage.tsdb.path={folder}/data",
             f"--web.listen-address={self.url[7:]}", "--log.level=warn"], stdout=self.log, stderr=self.log)
        self.wait(lambda: self.ready(), 30, "Prometheus to start")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            assert self.process.poll() is None, self.logged()
            return False

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict, float]]:
        """The instant vector of `expr`, now or at the Unix time `at`."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, **({"time": at} if at else {})})
        with urllib.request.urlopen(url, timeout=5) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return result[0][1] if result else math.nan

    def firing(self, job: str) -> set[str]:
        return {m["alertname"] for m, _ in self.query(f'ALERTS{{alertstate="firing", job="{job}"}}')}

    def wait(self, condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}\n{self.logged()}"
            time.sleep(0.2)

    def logged(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def prometheus(tmp_path) -> Iterator:
    started: list[Prometheus] = []

    def start(port: int | None = None, sd_dir: str | None = None, config: dict | None = None) -> Prometheus:
        server = Prometheus(str(tmp_path), port, sd_dir, config)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
    gc.collect()  # the test's monitors go, and the endpoint closes with them: a later test opens its own


class AlertWatch:
    """Polls Prometheus's ALERTS for `job` on a thread while a fit runs: every alert seen firing, and when first."""

    def __init__(self, server: Prometheus, job: str) -> None:
        self.server, self.job, self.seen, self.first_seen = server, job, set(), {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            firing = self.server.firing(self.job)
            for name in firing - self.seen:
                self.first_seen[name] = time.monotonic()
            self.seen |= firing

    def stop(self) -> set[str]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


def test_histogram_quantile_reads_the_reports_median_and_p90(tmp_path, prometheus):
    rng = np.random.default_rng(7)
    stalls = rng.lognormal(np.log(0.012), 0.6, 400).clip(0.002, 0.08)  # step times spread over a decade
    monitor = UtilizationMonitor(str(tmp_path / "run"), prometheus_port=0, prometheus_job="quantiles",
                                 flush_secs=0.5)
    server = prometheus(monitor.prometheus_port)
    tiny_model().fit(stalled_dataset(400, lambda i: float(stalls[i]), prefetch="none"), epochs=1, verbose=0,
                     callbacks=[monitor])
    report = summarize(read_run(str(tmp_path / "run")))["step_ms"]
    server.wait(lambda: server.value('rnnmon_steps_total{job="quantiles"}') == 400, 20, "the last scrape")
    for q, name in ((0.5, "median"), (0.9, "p90")):
        read = 1e3 * server.value(f'histogram_quantile({q}, rnnmon_step_seconds_bucket{{job="quantiles"}})')
        assert read == pytest.approx(report[name], rel=0.10), (name, read, report)


def _fit_and_watch(tmp_path, prometheus, job: str, gpu: FakeGpu, dataset, model) -> tuple[set, Prometheus]:
    with installed(FakeNvmlLib([gpu])):
        monitor = UtilizationMonitor(str(tmp_path / job), prometheus_port=0, prometheus_job=job, flush_secs=0.5,
                                     sample_interval_s=0.1)
        server = prometheus(monitor.prometheus_port)
        server.wait(lambda: server.query(f'up{{instance="127.0.0.1:{monitor.prometheus_port}"}}'), 20,
                    "the first scrape")
        watch = AlertWatch(server, job)
        model.fit(dataset, epochs=1, verbose=0, callbacks=[monitor])
        seen = watch.stop()
    server.wait(lambda: server.value(f'rnnmon_training{{job="{job}"}}') == 0, 20, "the end of training scraped")
    server.wait(lambda: not server.firing(job), 15, "the alerts to stop once training ended")
    assert monitor.prometheus_port is not None  # the monitor (and its series) still live: the gate did it
    return seen, server


def test_gpu_util_rule_fires_on_a_starved_gpu_and_stops_when_training_ends(tmp_path, prometheus):
    # The latest sample crosses 20% every 0.3 s (a gauge rule never holds); the windowed mean is 15%.
    starved = FakeGpu(utilization=lambda t: 0.0 if t % 0.6 < 0.3 else 30.0, pids=[os.getpid()])
    seen, server = _fit_and_watch(tmp_path, prometheus, "starved", starved,
                             stalled_dataset(1000, 0.02, prefetch="none"), tiny_model())  # 20 s: for: 10s holds
    assert {"RnnmonGpuUtilLow", "RnnmonInputWaitHigh"} <= seen, seen
    # The [1m] mean still holds the starved fit: the alert stopped because rnnmon_training went to 0.
    assert server.query('rate(rnnmon_gpu_busy_seconds_total{job="starved"}[1m])'
                        ' / rate(rnnmon_gpu_sampled_seconds_total{job="starved"}[1m]) < 0.20')


def test_the_rules_stay_silent_on_a_tuned_run(tmp_path, prometheus):
    busy = FakeGpu(utilization=90.0, pids=[os.getpid()])
    seen, server = _fit_and_watch(tmp_path, prometheus, "tuned", busy, stalled_dataset(500, prefetch="explicit"),
                                  tiny_model(device_s=0.012))
    assert not seen, seen
    assert server.value('rnnmon_gpu_busy_seconds_total{job="tuned"}') > 0  # the rule had data to judge


def test_a_long_warmup_pages_no_one(tmp_path, prometheus):
    """The first batch takes 12 s (a pipeline filling its buffers, a long compile) while the GPU idles, then the
    fit runs at 90%: the fast rules at a 1 s evaluation interval stay silent throughout."""
    started = {"at": math.inf}

    def first_batch_slow(batch: int) -> float:
        if batch == 0:
            started["at"] = time.time() + 12.0
            return 12.0
        return 0.0

    gpu = FakeGpu(utilization=lambda t: 90.0 if t >= started["at"] else 0.0, pids=[os.getpid()])
    seen, server = _fit_and_watch(tmp_path, prometheus, "warm", gpu,
                                  stalled_dataset(600, first_batch_slow, prefetch="explicit"),
                                  tiny_model(device_s=0.012))
    assert not seen, seen
    assert server.value('max_over_time(rnnmon_warmup{job="warm"}[5m])') == 1  # the exporter said so
    assert server.value('rnnmon_gpu_idle_seconds_total{job="warm",cause="warmup"}') >= 10  # booked as warm-up
    assert server.value('rnnmon_gpu_busy_seconds_total{job="warm"} / rnnmon_gpu_sampled_seconds_total') > 0.8


TRAIN_UNTIL_STOPPED = """
import sys, time, numpy as np, keras, rnnmon
monitor = rnnmon.UtilizationMonitor(sys.argv[1], prometheus_port=0, prometheus_sd_dir=sys.argv[2])
class Started(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            print("training", flush=True)
        time.sleep(0.01)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
x = np.zeros((64, 4), "float32")
model.fit(x, x[:, :1], batch_size=1, epochs=10000, verbose=0, callbacks=[monitor, Started()])
"""


def test_no_target_outlives_its_process(tmp_path, prometheus):
    """Two processes announce themselves through file_sd; one is stopped by SIGTERM (a scheduler), one by SIGKILL
    (the OOM killer): the first removes its file, the next monitor on the folder removes the second's."""
    sd_dir = str(tmp_path / "sd")
    os.mkdir(sd_dir)  # before Prometheus starts: it watches only a folder that exists (else rereads it in 5 m)
    server = prometheus(sd_dir=sd_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    children = [subprocess.Popen([sys.executable, "-c", TRAIN_UNTIL_STOPPED, str(tmp_path / name), sd_dir],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
                for name in ("stopped", "killed")]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "training", child.poll()
        server.wait(lambda: len(server.query("up == 1")) == 2, 20, "both processes scraped")
        stopped, killed = children
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(30) == -signal.SIGTERM  # it still dies of the signal, as the scheduler expects
        assert len(os.listdir(sd_dir)) == 1  # its file went with it
        killed.kill()
        assert killed.wait(30) == -signal.SIGKILL
        assert len(os.listdir(sd_dir)) == 1  # nothing runs on SIGKILL: its file stays ...
        server.wait(lambda: server.query("up == 0"), 20, "the killed process's target down")
        monitor = UtilizationMonitor(str(tmp_path / "next"), prometheus_port=free_port(), prometheus_sd_dir=sd_dir)
        assert os.listdir(sd_dir) == [f"127.0.0.1-{monitor.prometheus_port}.json"]  # ... until the next monitor
        server.wait(lambda: [m["instance"] for m, _ in server.query("up")]
                    == [f"127.0.0.1:{monitor.prometheus_port}"], 20, "the dead targets gone from Prometheus")
    finally:
        for child in children:
            child.kill()
            child.wait()


def docs_config(folder: str, target: int) -> dict:
    """The first scrape configuration of docs/prometheus.md as a reader copies it, the rules file saved beside it
    under the name it gives; only the targets are this test's."""
    with open(os.path.join(ROOT, "docs", "prometheus.md"), encoding="utf-8") as page:
        section = page.read().split("## Scrape configuration", 1)[1]
    config = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    [job] = config["scrape_configs"]
    assert job["static_configs"][0]["targets"][0].startswith("trainer-")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{target}"]}]
    shutil.copy(os.path.join(ROOT, "docs", "prometheus-rules.yml"), os.path.join(folder, *config["rule_files"]))
    return config


class StopOnce(keras.callbacks.Callback):
    """Ends the fit a few steps after `condition()` holds."""

    def __init__(self, condition) -> None:
        super().__init__()
        self.condition = condition

    def on_train_batch_end(self, batch, logs=None):
        if batch % 20 == 0 and self.condition():
            self.model.stop_training = True


def test_the_docs_config_as_copied_pages_in_time_and_stops_within_30s_of_the_fit(tmp_path, prometheus):
    """rnnmon judges GPU memory over 2 s here (its default is 30 s): Prometheus, configured as docs/prometheus.md
    says, pages within a scrape, an evaluation and a flush of that, and stops within 30 s of the fit's end."""
    fired: dict[str, float] = {}
    full = FakeGpu(memory_used_mib=143000, pids=[os.getpid()])  # 99.5% of 143771 MiB
    with installed(FakeNvmlLib([full])):
        monitor = UtilizationMonitor(
            str(tmp_path / "run"), prometheus_port=0, prometheus_job="copied", sample_interval_s=0.1,
            thresholds={"gpu_memory_high": {"for_s": 2}},
            on_alert=lambda event: fired.setdefault(event.rule, time.monotonic()))
        server = prometheus(config=docs_config(str(tmp_path), monitor.prometheus_port))
        watch = AlertWatch(server, "copied")
        tiny_model().fit(stalled_dataset(6000, 0.01), epochs=1, verbose=0,
                         callbacks=[monitor, StopOnce(lambda: "RnnmonGpuMemoryHigh" in watch.seen)])
        ended = time.monotonic()
    server.wait(lambda: not server.firing("copied"), 45, "the alerts to stop")
    stopped_after = time.monotonic() - ended
    watch.stop()
    paged_after = watch.first_seen["RnnmonGpuMemoryHigh"] - fired["gpu_memory_high"]
    assert paged_after < 15 + 10 + 2 + 1, paged_after  # a scrape, an evaluation, a flush, a poll of ALERTS
    assert stopped_after < 30, stopped_after




@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_the_straggler_rule_reads_the_reports_share_on_a_real_2_process_jax_job(tmp_path, prometheus):
    """Two JAX processes (gloo on CPU) that set their index in code, one stalling 12 ms a batch on a ~90 ms step,
    scraped through file_sd: the fast profile's rule names worker-1 with the report's share, within 20%."""
    from rnnmon.analysis.stragglers import compare_workers
    from rnnmon.analysis.worker_figures import worker_figures
    from rnnmon.format.logdir import read_logdir

    sd_dir, logs = tmp_path / "sd", tmp_path / "logs"
    sd_dir.mkdir()
    server = prometheus(sd_dir=str(sd_dir))
    with open(os.path.join(ROOT, "docs", "prometheus-rules-fast.yml"), encoding="utf-8") as file:
        rule = next(r for group in yaml.safe_load(file)["groups"] for r in group["rules"]
                    if r["alert"] == "RnnmonStraggler")
    share_expr = rule["expr"].split(">= 0.05")[0]  # the rule's share, ungated and unthresholded
    assert share_expr.count("[30s]") == 10
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    port = free_port()
    monitor = json.dumps({"flush_secs": 0.5, "prometheus_port": 0, "prometheus_job": "jaxjob",
                          "prometheus_sd_dir": str(sd_dir)})
    processes = [subprocess.Popen([sys.executable, "-c", JOB, str(logs), str(i), str(port), str(stall), "200", monitor],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for i, stall in ((0, 0.0), (1, 0.012))]
    training: list[float] = []  # when both processes were seen training
    paged: set[str] = set()
    try:
        while any(p.poll() is None for p in processes):
            if len(server.query('rnnmon_training{job="jaxjob"} == 1')) == 2:
                training.append(time.time())
            paged |= {m["worker"] for m, _ in server.query(
                'ALERTS{alertname="RnnmonStraggler", alertstate="firing", job="jaxjob"}')}
            time.sleep(0.5)
        errors = [p.communicate(timeout=30)[1] for p in processes]
    finally:
        for p in processes:
            p.kill()
    assert [p.returncode for p in processes] == [0, 0], [e[-2000:] for e in errors]
    (group,) = compare_workers([worker_figures(run) for run in read_logdir(str(logs)).values()])
    by_name = {w["worker"]: w for w in group["workers"]}
    report = sum(by_name["worker-1"][k] - by_name["worker-0"][k] for k in ("input_wait_ms", "host_gap_ms")) \
        / by_name["worker-0"]["step_ms"]
    assert group["findings"][0]["where"] == "worker-1", group
    # The rule's expression over the whole fit, as the report reads it (over its last 30 s the load differs).
    whole_fit = share_expr.replace("[30s]", f"[{round(training[-1] - training[0]) + 5}s]")
    rule_share = {m["worker"]: v for m, v in server.query(whole_fit, at=training[-1])}
    assert rule_share["worker-1"] == pytest.approx(report, rel=0.2), (rule_share, report, by_name)
    assert paged == {"worker-1"}, paged  # the page names the process that stalls
