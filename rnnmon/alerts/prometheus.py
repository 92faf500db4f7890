"""Prometheus exporter: the recorder's chunks as metrics on an HTTP endpoint, for fleets that already scrape.

Opt-in (`UtilizationMonitor(log_dir, prometheus_port=9400)`), built on `prometheus_client` with its own
registry, fed on rnnmon's background thread from the chunks the recorder already builds: nothing runs on the
training thread. The metric names are a contract, documented in docs/prometheus.md. Every series carries the
labels `job` and `worker`.

Example:
    >>> exporter = PrometheusExporter(job="lstm-sweep", worker="0")
    >>> exporter.serve(port=0)            # a free port; logged, and returned
    40123
    >>> exporter.on_chunk(chunk, firing=["input_wait_high"])   # after Alerting.on_chunk
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from rnnmon.alerts.thresholds import Thresholds
from rnnmon.analysis.verdict import VERDICTS, verdict
from rnnmon.format import schema

LOG = logging.getLogger("rnnmon")
RULES = tuple(f.name for f in dataclasses.fields(Thresholds))
_STEP_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_WAIT_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0)


class _Histogram:
    """A histogram filled a chunk at a time with numpy: no Python work per step, even at thousands per chunk."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = np.asarray(buckets)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # the last one: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, values: np.ndarray) -> None:
        values = np.clip(values[~np.isnan(values)], 0.0, None)  # time can go backwards
        counts = np.bincount(np.searchsorted(self._bounds, values, side="left"), minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(values.sum())

    def family(self, labels: list[str]) -> Any:
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        with self._lock:
            cumulative, total = np.cumsum(self._counts), self._sum
        buckets = [(floatToGoString(b), float(c)) for b, c in zip(self._bounds, cumulative[:-1])]
        family = HistogramMetricFamily(self.name, self.documentation, labels=["job", "worker"])
        family.add_metric(labels, [*buckets, ("+Inf", float(cumulative[-1]))], total)
        return family


class _Histograms:
    """The registry's view of the `_Histogram`s (a custom collector)."""

    def __init__(self, histograms: list[_Histogram], labels: list[str]) -> None:
        self._histograms, self._labels = histograms, labels

    def collect(self) -> Iterator[Any]:
        for histogram in self._histograms:
            yield histogram.family(self._labels)


class PrometheusExporter:
    """The rnnmon metrics of one process, in a registry of their own, served over HTTP by `serve()`.

    Args:
        job: The `job` label on every series. Defaults to `"rnnmon"`.
        worker: The `worker` label on every series (the task index in multi-worker training). Defaults to `"0"`.
    """

    def __init__(self, *, job: str = "rnnmon", worker: str = "0") -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge
        except ImportError:
            raise ImportError("rnnmon: prometheus_port needs prometheus_client: "
                              "pip install 'rnnmon[prometheus]' (or prometheus-client)") from None

        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = {"job": job, "worker": worker}
        names = ("job", "worker")
        r = self.registry
        self._step = _Histogram("rnnmon_step_seconds", "Step time (begin to end of one recorded step)",
                                _STEP_BUCKETS_S)
        self._wait = _Histogram("rnnmon_input_wait_seconds", "Time a step waited for its batch", _WAIT_BUCKETS_S)
        self._gap = _Histogram("rnnmon_host_gap_seconds", "Host time between one step's end and the next's begin",
                               _WAIT_BUCKETS_S)
        r.register(_Histograms([self._step, self._wait, self._gap], [job, worker]))
        self._steps = Counter("rnnmon_steps", "Training batches run", names, registry=r).labels(**self._labels)
        self._util = Gauge("rnnmon_gpu_utilization_ratio", "Latest driver utilization sample, 0-1",
                           (*names, "gpu"), registry=r)
        self._idle = Counter("rnnmon_gpu_idle_seconds", "GPU idle time by the cause it is blamed on",
                             (*names, "gpu", "cause"), registry=r)
        self._firing = Gauge("rnnmon_alert_firing", "1 while an rnnmon alert rule fires", (*names, "rule"),
                             registry=r)
        self._verdict = Gauge("rnnmon_verdict", "1 for the run's current verdict, 0 for the others",
                              (*names, "verdict"), registry=r)
        for rule in RULES:
            self._firing.labels(**self._labels, rule=rule).set(0)
        self._totals = {"steps": 0, "wait_s": 0.0, "gap_s": 0.0, "step_s": 0.0}
        self._set_verdict("insufficient-data")
        self.port: int | None = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int | None:
        """Start the HTTP endpoint (0 picks a free port); the bound port, or None after one error line."""
        from prometheus_client import start_http_server

        try:
            server, _ = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as error:
            LOG.error("rnnmon: the Prometheus endpoint is off, training continues unexported: cannot listen on "
                      "%s:%s (%s)", addr, port, error.strerror or error)
            return None
        self.port = int(server.server_port)
        LOG.warning("rnnmon: Prometheus metrics at http://%s:%d/metrics", addr, self.port)  # 0: which port
        return self.port

    def add_devices(self, indices: Iterable[int]) -> None:
        """Show a zero idle counter per cause for each GPU from the start, so rates exist before the first gap."""
        for index in indices:
            for cause in schema.GAP_CAUSES:
                self._idle.labels(**self._labels, gpu=str(index), cause=cause)

    def on_chunk(self, chunk: dict[str, Any], firing: Iterable[str] = ()) -> None:
        """Count one recorder chunk; `firing` names the rules firing after it (any device)."""
        if chunk["steps"]:
            rows = np.asarray(chunk["steps"], dtype=np.float64)
            self._steps.inc(float(rows[:, 6].sum()))
            rows = rows[~np.isnan(rows[:, 5])]  # a fit's warm-up step: tracing, not training
            duration = np.clip(rows[:, 3] - rows[:, 2], 0.0, None)
            gap, wait = np.clip(rows[:, 5], 0.0, None), np.clip(rows[:, 4], 0.0, None)
            self._step.observe(duration)
            self._gap.observe(gap)
            self._wait.observe(wait)
            totals = self._totals
            totals["steps"] += len(rows)
            totals["step_s"] += float(duration.sum() + gap.sum())
            totals["gap_s"] += float(gap.sum())
            floor_s = float(chunk.get("fetch_floor_s", 0.0)) * np.maximum(rows[:, 6], 1)
            totals["wait_s"] += float(np.nansum(np.clip(wait - floor_s, 0.0, None)))  # as the report: beyond the floor
        for index, samples in chunk["util"].items():
            if samples:
                self._util.labels(**self._labels, gpu=str(index)).set(samples[-1][1] / 100.0)
        for device, (start, end, cause) in chunk["gaps"]:
            if device != schema.STEP_DEVICE and end > start:
                self._idle.labels(**self._labels, gpu=str(device), cause=cause).inc(end - start)
        active = set(firing)
        for rule in RULES:
            self._firing.labels(**self._labels, rule=rule).set(1 if rule in active else 0)
        totals = self._totals
        self._set_verdict(verdict(totals["steps"], totals["wait_s"], totals["gap_s"], totals["step_s"]))

    def fit_ended(self) -> None:
        """Alerts resolve when a fit ends; the counters and the verdict stay for the last scrapes."""
        for rule in RULES:
            self._firing.labels(**self._labels, rule=rule).set(0)

    def _set_verdict(self, current: str) -> None:
        for name in VERDICTS:
            self._verdict.labels(**self._labels, verdict=name).set(1 if name == current else 0)
