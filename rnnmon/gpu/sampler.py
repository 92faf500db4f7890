"""Reads GPU utilization, device statistics and the process's CPU use; called on rnnmon's background thread.

Utilization comes from the driver's own sample buffer (`nvmlDeviceGetSamples`, every 1/6 s to 1 s
depending on the product), drained from the last timestamp seen so no sample is lost. Only after about two
driver periods with nothing new (some buffers run dry while the GPU idles) does a poll add one
`nvmlDeviceGetUtilizationRates` reading. NVML timestamps are treated as opaque and mapped onto the host's
monotonic clock by `Calibration`, which follows clock steps. Readings outside 0-100 are dropped.

A device without utilization support (MIG: both calls answer NOT_SUPPORTED) takes GPM SM activity in its
place where GPM exists (per MIG instance through `nvmlGpmMigSampleGet`), else it has no utilization rows
and `describe()` says why. GPM samples are taken at least 100 ms apart (nvml.h). PCIe traffic is the
change of the cumulative byte counters (field values 197/198) between polls, not a 20 ms snapshot.

Every time this module returns is on the monotonic clock.

Example:
    >>> sampler = Sampler(nvml, select_devices(nvml, "auto"))
    >>> sampler.poll()                    # every ~0.5 s
    >>> util, stats, host = sampler.drain()
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rnnmon.format.schema import STAT_COLUMNS
from rnnmon.gpu.devices import GpuTarget, open_target
from rnnmon.gpu.nvml import FUNCTION_NOT_FOUND, NOT_FOUND, NOT_SUPPORTED, Nvml

LOG = logging.getLogger("rnnmon")
NA = math.nan
_GPM_METRICS = (("sm_activity_pct", 2), ("sm_occupancy_pct", 3), ("tensor_util_pct", 5), ("dram_bw_util_pct", 10))
GPM_MIN_INTERVAL_S = 0.1  # nvml.h: nvmlGpmSampleGet calls "should be greater than 100ms" apart
_SLOWEST_PERIOD_S = 1.0  # nvidia-smi: the sample period is "between 1 second and 1/6 second"
_PCIE_FIELDS = (198, 197)  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES
_BUFFER_GONE = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})  # anything else may be transient

# What `describe()["utilization"]` says about where a device's utilization rows come from.
UTIL_NVML = "nvml"
UTIL_GPM = "gpm"
UTIL_NONE_MIG = "not reported on MIG"
UTIL_NONE = "not reported by this GPU"


class Calibration:
    """Maps opaque NVML sample timestamps (µs) to host monotonic seconds.

    Each drain says "the newest sample happened no later than now", so the offset is bounded above by
    `now - timestamp`; the estimate is the smallest bound among the last `window` drains. A bound more than
    `step_s` above the estimate can only come from the timestamp clock stepping back: the window restarts.
    """

    def __init__(self, window: int = 32, step_s: float = 1.0) -> None:
        self._bounds: collections.deque[float] = collections.deque(maxlen=window)
        self.step_s = step_s
        self.offset_s = math.inf

    def observe(self, timestamp_us: int, host_s: float) -> bool:
        """Take one bound; True when it shows a clock step (the estimate then starts afresh)."""
        bound = host_s - timestamp_us / 1e6
        stepped = bool(self._bounds) and bound - self.offset_s > self.step_s
        if stepped:
            self._bounds.clear()
        self._bounds.append(bound)
        self.offset_s = min(self._bounds)
        return stepped

    def reset(self) -> None:
        self._bounds.clear()
        self.offset_s = math.inf

    def to_host(self, timestamp_us: int) -> float:
        return timestamp_us / 1e6 + self.offset_s


@dataclass
class _Device:
    target: GpuTarget
    handle: Any  # the GPU's handle (the parent of a MIG device): GPU-wide metrics
    own_handle: Any  # the MIG device's own handle, or `handle`: memory
    name: str
    utilization: str = UTIL_NVML
    calibration: Calibration = field(default_factory=Calibration)
    period_s: float | None = None
    last_timestamp_us: int = 0
    last_new_s: float = 0.0  # host time of the last poll that brought a new buffered sample
    last_row_s: float = -math.inf  # host time of the newest utilization row
    use_buffer: bool = True
    reasons_function: str = "nvmlDeviceGetCurrentClocksEventReasons"
    use_pcie_counters: bool = True
    pcie_counters: tuple[float, float, float] | None = None  # host time, RX bytes, TX bytes
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_primed: bool = False
    gpm_last_s: float = -math.inf
    warned_range: bool = False

    @property
    def index(self) -> int:
        return self.target.index


class Sampler:
    """Polls NVML for each chosen device and the process's CPU use; `drain()` hands over what was read.

    Per device (keyed by the NVML index of the GPU): utilization rows (time, pct) and stat rows
    (`schema.STAT_COLUMNS`, declared in `rnnmon.format.series.STATS`: a value is keyed by its column name).
    """

    def __init__(self, nvml: Nvml, targets: Sequence[GpuTarget | int],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._nvml = nvml
        self._clock = clock
        self._lock = threading.Lock()  # the buffers: filled on the sampler thread, drained on the writer thread
        self._since = clock()  # the driver's buffer also holds ~16 s from before monitoring began
        chosen = [t if isinstance(t, GpuTarget) else GpuTarget(t, "") for t in targets]
        self.devices = [d for d in (self._open(t) for t in chosen) if d is not None]
        self._util: dict[int, list[tuple[float, float]]] = {d.index: [] for d in self.devices}
        self._stats: dict[int, list[tuple[float, ...]]] = {d.index: [] for d in self.devices}
        self._host: list[tuple[float, float]] = []
        self._last_cpu = (clock(), time.process_time())

    def describe(self) -> list[dict[str, Any]]:
        """Per device: index, name, uuid, where utilization comes from, and the MIG instance if any."""
        described = []
        for d in self.devices:
            entry: dict[str, Any] = {"index": d.index, "name": d.name, "uuid": d.target.uuid,
                                     "utilization": d.utilization}
            if d.target.mig is not None:
                entry["mig"] = {"gpu_instance_id": d.target.mig.gpu_instance_id,
                                "compute_instance_id": d.target.mig.compute_instance_id}
            described.append(entry)
        return described

    def poll(self) -> None:
        for device in self.devices:
            if device.index in self._nvml.lost:
                continue
            if device.utilization == UTIL_NVML:
                self._read_utilization(device)
            row = self._read_stats(device)
            with self._lock:
                self._stats[device.index].append(row)
        now, cpu = self._clock(), time.process_time()
        last_now, last_cpu = self._last_cpu
        if now > last_now:
            with self._lock:
                self._host.append((now, 100.0 * (cpu - last_cpu) / (now - last_now)))
        self._last_cpu = (now, cpu)

    def drain(self) -> tuple[dict[int, list[tuple[float, float]]], dict[int, list[tuple[float, ...]]],
                             list[tuple[float, float]]]:
        """Utilization rows (time, pct) and stat rows per device, and host rows (time, cpu_pct).

        Called from the writer thread while `poll()` runs on the sampler thread: only the hand-over is locked,
        never an NVML call, so a hung driver call does not hold up a write.
        """
        with self._lock:
            util, stats, host = self._util, self._stats, self._host
            self._util = {i: [] for i in self._util}
            self._stats = {i: [] for i in self._stats}
            self._host = []
        return {i: sorted(rows) for i, rows in util.items()}, stats, host

    def close(self) -> None:
        for device in self.devices:
            self._free_gpm(device)

    # --- opening ---------------------------------------------------------------------------------------
    def _open(self, target: GpuTarget) -> _Device | None:
        q, index = self._nvml.query, target.index
        handles = open_target(self._nvml, target)
        if handles is None:
            return None
        parent, own = handles
        name = _text(q("nvmlDeviceGetName", own, label="device name", device=index))
        uuid = target.uuid or _text(q("nvmlDeviceGetUUID", own, label="device UUID", device=index)) or ""
        device = _Device(GpuTarget(index, uuid, target.mig), parent, own, name or f"GPU {index}",
                         last_new_s=self._clock())
        _, code = self._nvml.query_code("nvmlDeviceGetUtilizationRates", parent, label="utilization",
                                        device=index, quiet={NOT_SUPPORTED: None})
        support = q("nvmlGpmQueryDeviceSupport", parent, label="GPM (SM activity)", device=index)
        if support is not None and support.isSupportedDevice:
            self._alloc_gpm(device)
        if code == NOT_SUPPORTED:
            if device.gpm_samples:
                device.utilization = UTIL_GPM
            else:
                device.utilization = UTIL_NONE_MIG if target.mig is not None else UTIL_NONE
            LOG.info("rnnmon: GPU %d (%s) reports no utilization; %s.", index, device.name,
                     "GPM SM activity stands in for it" if device.gpm_samples else "idle gaps come from step phases")
        return device

    def _alloc_gpm(self, device: _Device) -> None:
        for _ in range(2):
            sample = self._nvml.query("nvmlGpmSampleAlloc", label="GPM", device=device.index)
            if sample is None:
                self._free_gpm(device)  # one without the other is no use: give back what was taken
                return
            device.gpm_samples.append(sample)

    def _free_gpm(self, device: _Device) -> None:
        for sample in device.gpm_samples:
            self._nvml.query("nvmlGpmSampleFree", sample, label="GPM", device=device.index)
        device.gpm_samples = []

    # --- utilization -----------------------------------------------------------------------------------
    def _read_utilization(self, device: _Device) -> None:
        now = self._clock()
        if device.use_buffer and self._read_buffer(device, now):
            return
        period = device.period_s or _SLOWEST_PERIOD_S
        if device.use_buffer and now - device.last_new_s < 2 * period:
            return  # the next buffered sample is still due: a reading now would copy the last one
        if device.use_buffer and self._recover_from_clock_step(device, now):
            return
        # The buffer ran dry (the GPU idles) or there is none: one reading of the last period.
        rates = self._nvml.query("nvmlDeviceGetUtilizationRates", device.handle, label="utilization",
                                 device=device.index)
        if rates is not None:
            self._add_rows(device, [(self._clock(), float(rates.gpu))])

    def _read_buffer(self, device: _Device, now: float) -> bool:
        """Take the buffered samples newer than the last seen; True if there were any."""
        samples = self._get_samples(device, device.last_timestamp_us)
        if samples is None:
            return False
        fresh = [s for s in samples if s.timeStamp > device.last_timestamp_us]
        if not fresh:
            return False
        self._learn_period(device, fresh)
        newest = max(s.timeStamp for s in fresh)
        device.calibration.observe(newest, now)
        device.last_timestamp_us = newest
        device.last_new_s = now
        self._add_rows(device, [(device.calibration.to_host(s.timeStamp), float(s.sampleValue.uiVal))
                                for s in fresh])
        return True

    def _get_samples(self, device: _Device, last_seen_us: int) -> list[Any] | None:
        answer, code = self._nvml.query_code(
            "nvmlDeviceGetSamples", device.handle, self._nvml.constant("NVML_GPU_UTILIZATION_SAMPLES"),
            last_seen_us, label="utilization samples", device=device.index, quiet={NOT_FOUND: (None, [])})
        if answer is None:
            if code in _BUFFER_GONE:
                device.use_buffer = False  # no buffer on this device: one reading per poll from now on
            return None
        return list(answer[1])

    def _recover_from_clock_step(self, device: _Device, now: float) -> bool:
        """After the timestamp clock steps back, nothing is "newer" than the last seen stamp: look at the
        whole buffer, and if its newest samples are older than that, start calibration and last-seen anew."""
        if not device.last_timestamp_us:
            return False
        samples = self._get_samples(device, 0)
        if not samples:
            return False
        stamps = [s.timeStamp for s in samples]
        cut = max((i for i in range(1, len(stamps)) if stamps[i] < stamps[i - 1]), default=0)
        since_step = samples[cut:]  # a ring buffer keeps the old stamps before the step
        newest = max(s.timeStamp for s in since_step)
        if newest >= device.last_timestamp_us:
            return False  # no step: the buffer has merely run dry
        LOG.info("rnnmon: the NVML timestamp clock of GPU %d stepped back; calibrating afresh.", device.index)
        device.calibration.reset()
        device.calibration.observe(newest, now)
        device.last_timestamp_us = newest
        device.last_new_s = now
        self._add_rows(device, [(device.calibration.to_host(s.timeStamp), float(s.sampleValue.uiVal))
                                for s in since_step], after_s=device.last_row_s)  # readings cover the rest
        return True

    def _learn_period(self, device: _Device, samples: list[Any]) -> None:
        if device.period_s is None and len(samples) >= 3:
            stamps = sorted(s.timeStamp for s in samples)
            device.period_s = statistics.median(b - a for a, b in itertools.pairwise(stamps)) / 1e6
            device.calibration.step_s = max(1.0, device.period_s + 0.5)

    def _add_rows(self, device: _Device, rows: list[tuple[float, float]], after_s: float = -math.inf) -> None:
        """Keep the rows since monitoring began (and after `after_s`) whose value is a percentage."""
        kept = []
        for time_s, pct in rows:
            if not 0.0 <= pct <= 100.0:
                if not device.warned_range:
                    device.warned_range = True
                    LOG.warning("rnnmon: GPU %d reported utilization %g%%, outside 0-100; such readings are "
                                "dropped.", device.index, pct)
                continue
            if time_s >= self._since and time_s > after_s:
                kept.append((time_s, pct))
        if kept:
            device.last_row_s = max(device.last_row_s, max(t for t, _ in kept))
            with self._lock:
                self._util[device.index].extend(kept)

    # --- statistics ------------------------------------------------------------------------------------
    def _read_stats(self, device: _Device) -> tuple[float, ...]:
        q, h, i = self._nvml.query, device.handle, device.index
        c = self._nvml.constant
        memory = q("nvmlDeviceGetMemoryInfo", device.own_handle, label="memory", device=i)
        now = self._clock()
        values: dict[str, float] = {
            "time": now,
            "memory_used_mib": _scaled(memory and memory.used, 1 / 2**20),
            "memory_total_mib": _scaled(memory and memory.total, 1 / 2**20),
            "power_w": _scaled(q("nvmlDeviceGetPowerUsage", h, label="power", device=i), 1e-3),
            "sm_clock_mhz": _scaled(q("nvmlDeviceGetClockInfo", h, c("NVML_CLOCK_SM"), label="SM clock",
                                      device=i), 1),
            "temperature_c": _scaled(q("nvmlDeviceGetTemperature", h, c("NVML_TEMPERATURE_GPU"),
                                       label="temperature", device=i), 1),
            "clocks_event_reasons": _scaled(self._clock_reasons(device), 1),
        }
        values.update(self._read_pcie(device, now))
        values.update(self._read_gpm(device, now))
        return tuple(values.get(column, NA) for column in STAT_COLUMNS)

    def _clock_reasons(self, device: _Device) -> Any:
        """GetCurrentClocksEventReasons (R535+), else its older name GetCurrentClocksThrottleReasons."""
        value, code = self._nvml.query_code(device.reasons_function, device.handle, label="clock-event reasons",
                                            device=device.index, quiet={FUNCTION_NOT_FOUND: None})
        if code == FUNCTION_NOT_FOUND and device.reasons_function.endswith("EventReasons"):
            device.reasons_function = "nvmlDeviceGetCurrentClocksThrottleReasons"
            return self._clock_reasons(device)
        if code == FUNCTION_NOT_FOUND:
            self._nvml.query(device.reasons_function, device.handle, label="clock-event reasons",
                             device=device.index)  # logs the one warning
        return value

    def _read_pcie(self, device: _Device, now: float) -> dict[str, float]:
        """MiB/s moved since the previous poll, from the cumulative byte counters; the 20 ms snapshot
        `nvmlDeviceGetPcieThroughput` only where the counters are missing."""
        q, h, i = self._nvml.query, device.handle, device.index
        if device.use_pcie_counters:
            values = q("nvmlDeviceGetFieldValues", h, list(_PCIE_FIELDS), label="PCIe counters", device=i,
                       quiet={NOT_SUPPORTED: None, FUNCTION_NOT_FOUND: None})
            if values is not None and all(v.nvmlReturn == 0 for v in values):
                rx, tx = (float(v.value.ullVal) for v in values)
                previous, device.pcie_counters = device.pcie_counters, (now, rx, tx)
                if previous is None or now <= previous[0] or rx < previous[1] or tx < previous[2]:
                    return {}
                seconds = now - previous[0]
                return {"pcie_rx_mib_s": (rx - previous[1]) / seconds / 2**20,
                        "pcie_tx_mib_s": (tx - previous[2]) / seconds / 2**20}
            device.use_pcie_counters = False
        c = self._nvml.constant
        return {"pcie_rx_mib_s": _scaled(q("nvmlDeviceGetPcieThroughput", h, c("NVML_PCIE_UTIL_RX_BYTES"),
                                           label="PCIe throughput", device=i), 1 / 1024),
                "pcie_tx_mib_s": _scaled(q("nvmlDeviceGetPcieThroughput", h, c("NVML_PCIE_UTIL_TX_BYTES"),
                                           label="PCIe throughput", device=i), 1 / 1024)}

    def _read_gpm(self, device: _Device, now: float) -> dict[str, float]:
        if len(device.gpm_samples) != 2 or now - device.gpm_last_s < GPM_MIN_INTERVAL_S:
            return {}
        previous, current = device.gpm_samples
        if device.target.mig is not None:  # per instance, on the parent's handle (as DCGM does)
            taken = self._nvml.query("nvmlGpmMigSampleGet", device.handle, device.target.mig.gpu_instance_id,
                                     current, label="GPM", device=device.index)
        else:
            taken = self._nvml.query("nvmlGpmSampleGet", device.handle, current, label="GPM", device=device.index)
        if taken is None:
            return {}
        device.gpm_last_s = now
        device.gpm_samples = [current, previous]
        if not device.gpm_primed:
            device.gpm_primed = True
            return {}
        request = self._nvml.constant("c_nvmlGpmMetricsGet_t")()
        request.version = self._nvml.constant("NVML_GPM_METRICS_GET_VERSION")
        request.numMetrics = len(_GPM_METRICS)
        request.sample1, request.sample2 = previous, current
        for slot, (_, metric_id) in enumerate(_GPM_METRICS):
            request.metrics[slot].metricId = metric_id
        if self._nvml.query("nvmlGpmMetricsGet", request, label="GPM", device=device.index) is None:
            return {}
        values = {name: request.metrics[slot].value if request.metrics[slot].nvmlReturn == 0 else NA
                  for slot, (name, _) in enumerate(_GPM_METRICS)}
        if device.utilization == UTIL_GPM and values["sm_activity_pct"] == values["sm_activity_pct"]:
            self._add_rows(device, [(now, float(values["sm_activity_pct"]))])
        return values


def _scaled(value: Any, factor: float) -> float:
    return NA if value is None else float(value) * factor


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
