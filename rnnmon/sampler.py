"""Reads GPU utilization, device statistics and the process's CPU use; called on rnnmon's background thread.

Utilization comes from the driver's own sample buffer (`nvmlDeviceGetSamples`, about 6 per second), drained
from the last timestamp seen so no sample is lost. NVML timestamps are treated as opaque and mapped onto the
host's monotonic clock by `Calibration`. Every time this module returns is on that monotonic clock.

Example:
    >>> sampler = Sampler(nvml, [0])
    >>> sampler.poll()                    # every ~0.5 s
    >>> util, stats, host = sampler.drain()
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rnnmon.metadata import STAT_COLUMNS
from rnnmon.nvml import Nvml

NA = math.nan
_NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: no sample newer than the one asked for
_GPM_METRICS = (("sm_activity_pct", 2), ("sm_occupancy_pct", 3), ("tensor_util_pct", 5), ("dram_bw_util_pct", 10))


class Calibration:
    """Maps opaque NVML sample timestamps (µs) to host monotonic seconds.

    Each drain says "the newest sample happened no later than now", so the offset is bounded above by
    `now - timestamp`; the smallest bound seen so far is the estimate.
    """

    def __init__(self) -> None:
        self.offset_s = math.inf

    def observe(self, timestamp_us: int, host_s: float) -> None:
        self.offset_s = min(self.offset_s, host_s - timestamp_us / 1e6)

    def to_host(self, timestamp_us: int) -> float:
        return timestamp_us / 1e6 + self.offset_s


@dataclass
class _Device:
    index: int
    handle: Any
    name: str
    uuid: str
    calibration: Calibration = field(default_factory=Calibration)
    last_timestamp_us: int = 0
    use_buffer: bool = True
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_primed: bool = False


class Sampler:
    """Polls NVML for each chosen device and the process's CPU use; `drain()` hands over what was read."""

    def __init__(self, nvml: Nvml, indices: list[int], clock: Callable[[], float] = time.perf_counter) -> None:
        self._nvml = nvml
        self._clock = clock
        self._since = clock()  # the driver's buffer also holds ~16 s from before monitoring began
        self.devices = [d for d in (self._open(i) for i in indices) if d is not None]
        self._util: dict[int, list[tuple[float, float]]] = {d.index: [] for d in self.devices}
        self._stats: dict[int, list[tuple[float, ...]]] = {d.index: [] for d in self.devices}
        self._host: list[tuple[float, float]] = []
        self._last_cpu = (clock(), time.process_time())

    def describe(self) -> list[dict[str, Any]]:
        return [{"index": d.index, "name": d.name, "uuid": d.uuid} for d in self.devices]

    def poll(self) -> None:
        for device in self.devices:
            if device.index in self._nvml.lost:
                continue
            self._read_utilization(device)
            self._stats[device.index].append(self._read_stats(device))
        now, cpu = self._clock(), time.process_time()
        last_now, last_cpu = self._last_cpu
        if now > last_now:
            self._host.append((now, 100.0 * (cpu - last_cpu) / (now - last_now)))
        self._last_cpu = (now, cpu)

    def drain(self) -> tuple[dict[int, list[tuple[float, float]]], dict[int, list[tuple[float, ...]]],
                             list[tuple[float, float]]]:
        """Utilization rows (time, pct) and stat rows per device, and host rows (time, cpu_pct)."""
        util = {i: sorted(rows) for i, rows in self._util.items()}
        stats, host = self._stats, self._host
        self._util = {i: [] for i in self._util}
        self._stats = {i: [] for i in self._stats}
        self._host = []
        return util, stats, host

    def close(self) -> None:
        for device in self.devices:
            for sample in device.gpm_samples:
                self._nvml.query("nvmlGpmSampleFree", sample, label="GPM", device=device.index)
            device.gpm_samples = []

    def _open(self, index: int) -> _Device | None:
        handle = self._nvml.query("nvmlDeviceGetHandleByIndex", index, label="device handle", device=index)
        if handle is None:
            return None
        name = self._nvml.query("nvmlDeviceGetName", handle, label="device name", device=index)
        uuid = self._nvml.query("nvmlDeviceGetUUID", handle, label="device UUID", device=index)
        device = _Device(index, handle, _text(name) or f"GPU {index}", _text(uuid) or "")
        support = self._nvml.query("nvmlGpmQueryDeviceSupport", handle, label="GPM (SM activity)", device=index)
        if support is not None and support.isSupportedDevice:
            samples = [self._nvml.query("nvmlGpmSampleAlloc", label="GPM", device=index) for _ in range(2)]
            device.gpm_samples = [s for s in samples if s is not None]
        return device

    def _read_utilization(self, device: _Device) -> None:
        rows = self._util[device.index]
        if device.use_buffer:
            answer = self._nvml.query(
                "nvmlDeviceGetSamples", device.handle, self._nvml.constant("NVML_GPU_UTILIZATION_SAMPLES"),
                device.last_timestamp_us, label="utilization samples", device=device.index,
                quiet={_NOT_FOUND: (None, [])})
            now = self._clock()
            if answer is not None:
                samples = [s for s in answer[1] if s.timeStamp > device.last_timestamp_us]
                if samples:
                    newest = max(s.timeStamp for s in samples)
                    device.calibration.observe(newest, now)
                    device.last_timestamp_us = newest
                    times = [(device.calibration.to_host(s.timeStamp), float(s.sampleValue.uiVal)) for s in samples]
                    rows.extend(row for row in times if row[0] >= self._since)
                    return
            else:
                device.use_buffer = False  # unsupported: fall back to one reading per poll
        # No new buffered sample (the buffer runs dry while the GPU idles) or no buffer at all.
        rates = self._nvml.query("nvmlDeviceGetUtilizationRates", device.handle, label="utilization",
                                 device=device.index)
        if rates is not None:
            rows.append((self._clock(), float(rates.gpu)))

    def _read_stats(self, device: _Device) -> tuple[float, ...]:
        q, h, i = self._nvml.query, device.handle, device.index
        c = self._nvml.constant
        memory = q("nvmlDeviceGetMemoryInfo", h, label="memory", device=i)
        values: dict[str, float] = {
            "time": self._clock(),
            "memory_used_mib": _scaled(memory and memory.used, 1 / 2**20),
            "memory_total_mib": _scaled(memory and memory.total, 1 / 2**20),
            "power_w": _scaled(q("nvmlDeviceGetPowerUsage", h, label="power", device=i), 1e-3),
            "sm_clock_mhz": _scaled(q("nvmlDeviceGetClockInfo", h, c("NVML_CLOCK_SM"), label="SM clock",
                                      device=i), 1),
            "temperature_c": _scaled(q("nvmlDeviceGetTemperature", h, c("NVML_TEMPERATURE_GPU"),
                                       label="temperature", device=i), 1),
            "pcie_rx_mib_s": _scaled(q("nvmlDeviceGetPcieThroughput", h, c("NVML_PCIE_UTIL_RX_BYTES"),
                                       label="PCIe throughput", device=i), 1 / 1024),
            "pcie_tx_mib_s": _scaled(q("nvmlDeviceGetPcieThroughput", h, c("NVML_PCIE_UTIL_TX_BYTES"),
                                       label="PCIe throughput", device=i), 1 / 1024),
            "clocks_event_reasons": _scaled(q("nvmlDeviceGetCurrentClocksEventReasons", h,
                                              label="clock-event reasons", device=i), 1),
        }
        values.update(self._read_gpm(device))
        return tuple(values.get(column, NA) for column in STAT_COLUMNS)

    def _read_gpm(self, device: _Device) -> dict[str, float]:
        if len(device.gpm_samples) != 2:
            return {}
        previous, current = device.gpm_samples
        if self._nvml.query("nvmlGpmSampleGet", device.handle, current, label="GPM", device=device.index) is None:
            return {}
        device.gpm_samples = [current, previous]
        if not device.gpm_primed:
            device.gpm_primed = True
            return {}
        import pynvml  # only reached when NVML (and so pynvml) is running

        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        request.sample1, request.sample2 = previous, current
        for slot, (_, metric_id) in enumerate(_GPM_METRICS):
            request.metrics[slot].metricId = metric_id
        if self._nvml.query("nvmlGpmMetricsGet", request, label="GPM", device=device.index) is None:
            return {}
        return {name: request.metrics[slot].value if request.metrics[slot].nvmlReturn == 0 else NA
                for slot, (name, _) in enumerate(_GPM_METRICS)}


def _scaled(value: Any, factor: float) -> float:
    return NA if value is None else float(value) * factor


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value

