"""Prometheus exporter: the recorder's chunks as metrics on one HTTP endpoint per process, for fleets that scrape.

Opt-in (`UtilizationMonitor(log_dir, prometheus_port=9400)`), built on `prometheus_client`, fed on rnnmon's
background thread from the chunks the recorder already builds: nothing runs on the training thread. The metric
names are a contract, documented in docs/prometheus.md. Every series carries the labels `job` and `worker`.

Lifecycle: `attach(owner, ...)` opens the endpoint (or joins the one open on that port; port 0 joins any open
one) and hands the owner the exporter of its `job`/`worker` labels there, shared by every owner with those
labels, so consecutive fits add to one set of counters. An exporter is served while an owner holding it exists;
when the last owner is garbage-collected its series leave the endpoint, and when no exporter is left the endpoint
closes (socket, thread, file_sd file). `relabel` moves an owner to another `worker` label (a JAX process learns
its index when its fit starts).
Between fits `rnnmon_training` is 0, so rules gated on it are silent on a process that no longer trains; from a
fit's start until its warm-up step (tracing, compiling) is recorded `rnnmon_warmup` is 1, and the GPU's busy and
sampled seconds leave the warm-up out, as rnnmon's own rules do (rnnmon.alerts.rules).

Example:
    >>> exporter, port = attach(monitor, port=0, job="lstm-sweep", worker="0")   # a free port; logged
    >>> exporter.fit_started()
    >>> exporter.on_chunk(chunk, firing=["input_wait_high"])   # after Alerting.on_chunk
    >>> exporter.fit_ended()
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import stat
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from rnnmon.alerts.thresholds import Thresholds
from rnnmon.analysis.input_share import pipeline_wait_s
from rnnmon.analysis.verdict import VERDICTS, verdict
from rnnmon.capture import exits
from rnnmon.format import schema

LOG = logging.getLogger("rnnmon")
RULES = tuple(f.name for f in dataclasses.fields(Thresholds))
# Step time and input wait: 20 log-spaced buckets a decade from 0.1 ms to 100 s, so histogram_quantile's linear
# interpolation inside a bucket (12% wide) reads the medians the report uses (the straggler rule's) within a few
# percent (docs/prometheus.md: the cost). The host gap's rules use only its sum.
_STEP_BUCKETS_S = tuple(float(f"{b:.4g}") for b in np.logspace(-4, 2, 6 * 20 + 1))
_GAP_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0)
# Where launchers say which process of the host this is: torchrun, Slurm, Open MPI, MPICH/Intel MPI.
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's index among the job's processes on this host (0 when no launcher says)."""
    environ = os.environ if environ is None else environ
    for name in LOCAL_RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isascii() and value.isdigit() and int(value) < 1024:
            return int(value)
    return 0


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
    """The rnnmon metrics of one `job`/`worker` label set, in a registry of their own.

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
        self.labels = {"job": job, "worker": worker}
        names = ("job", "worker")
        r = self.registry
        self._step = _Histogram("rnnmon_step_seconds", "Step time (begin to end of one recorded step)",
                                _STEP_BUCKETS_S)
        self._wait = _Histogram("rnnmon_input_wait_seconds", "Time a step waited for its batch", _STEP_BUCKETS_S)
        self._gap = _Histogram("rnnmon_host_gap_seconds", "Host time between one step's end and the next's begin",
                               _GAP_BUCKETS_S)
        r.register(_Histograms([self._step, self._wait, self._gap], [job, worker]))
        self._training = Gauge("rnnmon_training", "1 while a fit of this job and worker runs, 0 between fits",
                               names, registry=r).labels(**self.labels)
        self._warmup = Gauge("rnnmon_warmup", "1 from a fit's start until its warm-up step (tracing, compiling) "
                             "is recorded, 0 after", names, registry=r).labels(**self.labels)
        self._steps = Counter("rnnmon_steps", "Training batches run", names, registry=r).labels(**self.labels)
        self._util = Gauge("rnnmon_gpu_utilization_ratio", "Latest driver utilization sample, 0-1",
                           (*names, "gpu"), registry=r)
        self._busy = Counter("rnnmon_gpu_busy_seconds", "Sampled time weighted by driver utilization",
                             (*names, "gpu"), registry=r)
        self._sampled = Counter("rnnmon_gpu_sampled_seconds", "Time covered by driver utilization samples",
                                (*names, "gpu"), registry=r)
        self._idle = Counter("rnnmon_gpu_idle_seconds", "GPU idle time by the cause it is blamed on",
                             (*names, "gpu", "cause"), registry=r)
        self._firing = Gauge("rnnmon_alert_firing", "1 while an rnnmon alert rule fires", (*names, "rule"),
                             registry=r)
        self._verdict = Gauge("rnnmon_verdict", "1 for the run's current verdict, 0 for the others",
                              (*names, "verdict"), registry=r)
        for rule in RULES:
            self._firing.labels(**self.labels, rule=rule).set(0)
        self._totals = {"steps": 0, "wait_s": 0.0, "gap_s": 0.0, "step_s": 0.0, "compile_s": 0.0, "plain_s": 0.0,
                        "plain_batches": 0.0, "batches": 0.0, "timed_batches": 0.0}
        self._last_sample: dict[int, float] = {}  # per GPU: the time of its latest utilization sample
        self._warm_end: float | None = -np.inf  # GPU samples before it are warm-up; None: the warm-up runs
        self._fits = 0
        self._fits_lock = threading.Lock()
        self._set_verdict("insufficient-data")

    def add_devices(self, indices: Iterable[int]) -> None:
        """Show zero counters for each GPU from the start, so rates exist before the first gap or sample."""
        for index in indices:
            self._busy.labels(**self.labels, gpu=str(index))
            self._sampled.labels(**self.labels, gpu=str(index))
            for cause in schema.GAP_CAUSES:
                self._idle.labels(**self.labels, gpu=str(index), cause=cause)

    def fit_started(self) -> None:
        """`rnnmon_training` is 1 from now until the last fit running with these labels ends."""
        with self._fits_lock:
            self._fits += 1
            self._training.set(1)
            self._warmup.set(1)
        self._warm_end = None
        self._last_sample.clear()  # the time between two fits is not sampled time

    def on_chunk(self, chunk: dict[str, Any], firing: Iterable[str] = ()) -> None:
        """Count one recorder chunk; `firing` names the rules firing after it (any device)."""
        if chunk["steps"]:
            rows = np.asarray(chunk["steps"], dtype=np.float64)
            self._steps.inc(float(rows[:, 6].sum()))
            self._end_warmup(rows)
            rows = rows[~np.isnan(rows[:, 5])]  # a fit's warm-up step: tracing, not training
            duration = np.clip(rows[:, 3] - rows[:, 2], 0.0, None)
            gap, wait = np.clip(rows[:, 5], 0.0, None), np.clip(rows[:, 4], 0.0, None)
            self._step.observe(duration)
            self._gap.observe(gap)
            self._wait.observe(wait)
            totals = self._totals
            totals["steps"] += len(rows)
            totals["step_s"] += float(duration.sum() + gap.sum())
            totals["compile_s"] += self._compile_s(rows, duration, chunk.get("compiles") or [])
            totals["gap_s"] += float(gap.sum())
            beyond = pipeline_wait_s(wait, rows[:, 6], float(chunk.get("fetch_floor_s", 0.0)))
            totals["wait_s"] += float(np.nansum(beyond))  # as the report: beyond the floor
            batches = np.maximum(rows[:, 6], 1)
            totals["batches"] += float(batches.sum())
            totals["timed_batches"] += float(batches[~np.isnan(wait)].sum())
        for index, samples in chunk["util"].items():
            if samples:
                self._count_utilization(index, samples)
        for device, (start, end, cause) in chunk["gaps"]:
            if device != schema.STEP_DEVICE and end > start:
                self._idle.labels(**self.labels, gpu=str(device), cause=cause).inc(end - start)
        active = set(firing)
        for rule in RULES:
            self._firing.labels(**self.labels, rule=rule).set(1 if rule in active else 0)
        totals = self._totals
        timed = totals["timed_batches"]  # all batches, or a sample's (TensorFlow, steps_per_execution > 1)
        wait_s = totals["wait_s"] * totals["batches"] / timed if timed else 0.0
        self._set_verdict(verdict(totals["steps"], wait_s, totals["gap_s"], totals["step_s"],
                                  totals["compile_s"], totals["step_s"]))

    def _end_warmup(self, rows: np.ndarray) -> None:
        """The warm-up ends with the fit's warm-up step (NaN host gap), or before the first step without one."""
        if self._warm_end is not None:
            return
        warmup = rows[np.isnan(rows[:, 5]), 3]
        self._warm_end = float(warmup.max()) if len(warmup) else -np.inf
        self._warmup.set(0)

    def _compile_s(self, rows: np.ndarray, duration: np.ndarray, compiles: list[tuple]) -> float:
        """The chunk's compile time, as the report counts it: the framework's measured seconds, else a compiling
        step's time beyond a step that compiled nothing (their mean per batch so far). `compiles`: the recorder's
        (step, batches, begin, end, count, seconds, source, shapes) tuples (rnnmon.capture.compiles)."""
        totals = self._totals
        compiled = np.isin(rows[:, 2], [record[2] for record in compiles])
        totals["plain_s"] += float(duration[~compiled].sum())
        totals["plain_batches"] += float(rows[~compiled, 6].sum())
        per_batch = totals["plain_s"] / totals["plain_batches"] if totals["plain_batches"] else 0.0
        seconds = 0.0
        for _, batches, begin, end, _, measured, _, _ in compiles:
            seconds += max(measured if measured == measured else end - begin - batches * per_batch, 0.0)
        return seconds

    def fit_ended(self) -> None:
        """Alerts resolve when a fit ends, and `rnnmon_training` drops to 0 once no fit with these labels runs;
        the counters and the verdict stay for the last scrapes."""
        self._warmup.set(0)
        for rule in RULES:
            self._firing.labels(**self.labels, rule=rule).set(0)
        with self._fits_lock:
            self._fits = max(self._fits - 1, 0)
            self._training.set(1 if self._fits else 0)

    def _count_utilization(self, index: int, samples: list[tuple[float, float]]) -> None:
        """Each sample's utilization holds from the previous sample to it: busy and sampled seconds grow by it.
        Samples of the warm-up count for neither: a GPU idle while the first step compiles is not underused."""
        times = np.asarray([t for t, _ in samples])
        ratios = np.asarray([u for _, u in samples]) / 100.0
        previous = self._last_sample.get(index, times[0])
        spans = np.clip(np.diff(times, prepend=previous), 0.0, None)
        self._last_sample[index] = float(times[-1])
        after_warmup = times >= (np.inf if self._warm_end is None else self._warm_end)
        spans, ratios = spans[after_warmup], ratios[after_warmup]
        labels = {**self.labels, "gpu": str(index)}
        self._busy.labels(**labels).inc(float((spans * ratios).sum()))
        self._sampled.labels(**labels).inc(float(spans.sum()))
        self._util.labels(**labels).set(float(samples[-1][1]) / 100.0)

    def _set_verdict(self, current: str) -> None:
        for name in VERDICTS:
            self._verdict.labels(**self.labels, verdict=name).set(1 if name == current else 0)


class _Endpoint:
    """One HTTP server and the exporters it serves: (job, worker) → [exporter, owners holding it]."""

    def __init__(self, addr: str, port: int, sd_dir: str | None, job: str) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.exporters: dict[tuple[str, str], list[Any]] = {}
        self.holds: dict[tuple[int, tuple[str, str]], weakref.finalize] = {}  # (id(owner), key) → its release
        registry = CollectorRegistry(auto_describe=True)
        registry.register(self)
        self.server, self.thread = start_http_server(port, addr=addr, registry=registry)
        self.addr, self.port = addr, int(self.server.server_port)
        self.sd_file = _write_sd_file(sd_dir, addr, self.port, job) if sd_dir else None

    def collect(self) -> Iterator[Any]:
        """The series of every exporter still held, one family per name (the registry's one collector)."""
        from prometheus_client.metrics_core import Metric

        with _LOCK:
            exporters = [held[0] for held in self.exporters.values()]
        merged: dict[str, Any] = {}
        for exporter in exporters:
            for family in exporter.registry.collect():
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                into.samples.extend(family.samples)
        yield from merged.values()

    def hold(self, owner: object, exporter: PrometheusExporter) -> PrometheusExporter:
        """The exporter of `exporter`'s labels here (it, or the one already held), now also held by `owner`."""
        key = (exporter.labels["job"], exporter.labels["worker"])
        held = self.exporters.setdefault(key, [exporter, 0])
        held[1] += 1
        self.holds[(id(owner), key)] = weakref.finalize(owner, self.release, key, id(owner))
        return held[0]

    def release(self, key: tuple[str, str], owner_id: int) -> None:
        """An owner is gone: drop its exporter when no owner holds it, and close when none is left."""
        with _LOCK:
            self.holds.pop((owner_id, key), None)
            held = self.exporters[key]
            held[1] -= 1
            if held[1] > 0:
                return
            del self.exporters[key]
            if self.exporters:
                return
            _ENDPOINTS.remove(self)
        if self.sd_file:
            with contextlib.suppress(OSError):
                os.unlink(self.sd_file)
        if threading.current_thread() is self.thread:  # collected while serving a scrape: close from elsewhere
            threading.Thread(target=self._close, name="rnnmon-prometheus-close", daemon=True).start()
        else:
            self._close()

    def _close(self) -> None:
        # The serve loop sees shutdown() only when its select() returns, up to 0.5 s later (prometheus_client's
        # poll). On Linux, shutting the listening socket down makes it readable at once: the loop wakes, its
        # accept fails quietly, and it sees the request. Elsewhere that call fails and the poll is waited out.
        with contextlib.suppress(OSError):
            self.server.socket.shutdown(socket.SHUT_RDWR)
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5.0)


_LOCK = threading.RLock()  # re-entrant: a garbage collection inside it may release an owner
_ENDPOINTS: list[_Endpoint] = []


def attach(owner: object, *, port: int, addr: str = "127.0.0.1", job: str = "rnnmon", worker: str = "0",
           sd_dir: str | None = None) -> tuple[PrometheusExporter | None, int | None]:
    """The exporter of `job`/`worker`, served while `owner` exists, and the endpoint's port.

    `port` plus the local rank (see `local_rank`) opens an endpoint there or joins the one open there; 0 joins
    the open endpoint on `addr`, or opens one on a free port. (None, None) after one error line when the port
    cannot be had.
    """
    exporter = PrometheusExporter(job=job, worker=worker)  # raises ImportError first without prometheus_client
    wanted = port + local_rank() if port else 0
    with _LOCK:
        endpoint = next((e for e in _ENDPOINTS if e.addr == addr and wanted in (0, e.port)), None)
        if endpoint is None:
            try:
                endpoint = _Endpoint(addr, wanted, sd_dir, job)
            except OSError as error:
                LOG.error("rnnmon: the Prometheus endpoint is off, training continues unexported: cannot listen "
                          "on %s:%s (%s)", addr, wanted, error.strerror or error)
                return None, None
            LOG.warning("rnnmon: Prometheus metrics at http://%s:%d/metrics", addr, endpoint.port)  # 0: which port
            _ENDPOINTS.append(endpoint)
        return endpoint.hold(owner, exporter), endpoint.port


def share(owner: object, exporter: PrometheusExporter) -> None:
    """`owner` (a copy of a monitor) holds `exporter` too: it is served until both are gone."""
    key = (exporter.labels["job"], exporter.labels["worker"])
    with _LOCK:
        for endpoint in _ENDPOINTS:
            if endpoint.exporters.get(key, [None])[0] is exporter:
                endpoint.hold(owner, exporter)


def relabel(owner: object, exporter: PrometheusExporter, *, worker: str) -> PrometheusExporter:
    """The exporter of `exporter`'s job and `worker` on its endpoint, held by `owner` in place of `exporter` (whose
    series leave the endpoint once no owner holds them): a JAX process learns its index only when a fit starts."""
    old = (exporter.labels["job"], exporter.labels["worker"])
    with _LOCK:
        for endpoint in _ENDPOINTS:
            release = endpoint.holds.get((id(owner), old))
            if release is not None:
                relabelled = endpoint.hold(owner, PrometheusExporter(job=old[0], worker=worker))
                release()
                return relabelled
    return exporter


def _write_sd_file(sd_dir: str, addr: str, port: int, job: str) -> str | None:
    """A file_sd_configs target file for this endpoint, `<sd_dir>/<host>-<port>.json`, written atomically: through
    a new `.tmp` file (`O_EXCL`, `O_NOFOLLOW`: a link planted under its name is removed, never written through),
    after removing the files that dead processes of this machine left there. Its `__meta_` labels (dropped by
    Prometheus after relabelling) say which machine and process wrote it."""
    host = socket.getfqdn() if addr in ("0.0.0.0", "::", "") else addr
    path = os.path.join(sd_dir, f"{host}-{port}.json")
    labels = {"rnnmon_job": job, "__meta_rnnmon_machine": socket.gethostname(), "__meta_rnnmon_pid": str(os.getpid())}
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        os.makedirs(sd_dir, exist_ok=True)
        _remove_stale_sd_files(sd_dir)
        try:
            fd = os.open(f"{path}.tmp", flags, 0o644)
        except FileExistsError:  # a stale one, or a link: removed (the link, not what it points to), made anew
            os.unlink(f"{path}.tmp")
            fd = os.open(f"{path}.tmp", flags, 0o644)
        with open(fd, "w", encoding="utf-8") as file:
            json.dump([{"targets": [f"{host}:{port}"], "labels": labels}], file)
        os.replace(f"{path}.tmp", path)
    except OSError as error:
        LOG.error("rnnmon: cannot write the Prometheus file_sd target %s (%s); the endpoint is served anyway",
                  path, error.strerror or error)
        return None
    return path


def _remove_stale_sd_files(sd_dir: str) -> None:
    """Remove the target files in `sd_dir` of processes of this machine that are gone (SIGKILL, a crash, a lost
    container), whose target Prometheus would show as down for good: written here, and their process has exited
    or nothing listens at their target any more (a pid reused by a restarted container)."""
    machine = socket.gethostname()
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # no link, no FIFO's wait
    for name in os.listdir(sd_dir):
        path = os.path.join(sd_dir, name)
        try:
            if not name.endswith(".json"):
                continue
            with open(os.open(path, flags), encoding="utf-8") as file:
                if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                    continue
                [group] = json.loads(file.read(_SD_FILE_MAX_CHARS))
            labels, [target] = group["labels"], group["targets"]
            pid = int(labels["__meta_rnnmon_pid"])
        except (OSError, ValueError, LookupError, TypeError):  # not ours, or from an older rnnmon: left alone
            continue
        if labels.get("__meta_rnnmon_machine") == machine and not (_alive(pid) and _listening(target)):
            with contextlib.suppress(OSError):
                os.unlink(path)
                LOG.info("rnnmon: removed %s, the Prometheus target of process %d, gone", path, pid)


_SD_FILE_MAX_CHARS = 65536  # an rnnmon target file is one target: anything longer is not one


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def _listening(target: str) -> bool:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except ConnectionRefusedError:
        return False
    except (OSError, ValueError):  # unresolvable or slow: not known to be gone
        return True


def _remove_sd_files() -> None:
    """The process dies of a signal: its endpoints' target files go first (nothing else would remove them)."""
    for endpoint in list(_ENDPOINTS):
        if endpoint.sd_file:
            with contextlib.suppress(OSError):
                os.unlink(endpoint.sd_file)


exits.before_signal_death(_remove_sd_files)
