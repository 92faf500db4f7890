"""A scripted fake of the NVML C library that drives the real `pynvml` binding.

`pynvml` looks up every C function with `getattr(pynvml.nvmlLib, name)`, so `installed()` puts a
`FakeNvmlLib` there and the real Python wrappers (argument packing, two-call patterns, versioned
structs, error classes) run unchanged against it. Metrics are constants or functions of host time.

Example:
    clock = ManualClock()
    lib = FakeNvmlLib([FakeGpu(utilization=lambda t: 50.0, pids=[os.getpid()])], clock=clock)
    with installed(lib):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        clock.advance(1.0)
        _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        lib.host_time_of(samples[-1].timeStamp)  # back to clock() time
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pynvml

Value = float | Callable[[float], float]  # a constant, or a function of host time (seconds)

MIB = 1 << 20
FAKE_UPTIME_US = 123_456_789_000  # default timestamp at construction: ~1.4 days of "uptime", not Unix time

# C functions that do not touch a device, so they keep working when the GPU is lost.
_HOST_FUNCTIONS = frozenset(
    {
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetCount_v2",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
    }
)
_GPM_METRIC_FIELDS = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_util_pct",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy_pct",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_util_pct",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_bw_util_pct",
}


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = ""  # FakeNvmlLib fills in "GPU-<index>-..." when empty
    utilization: Value = 90.0  # GPU busy %, sampled on the lib's grid (GetSamples, GetUtilizationRates)
    memory_utilization: Value = 30.0  # c_nvmlUtilization_t.memory
    memory_total_mib: int = 143771
    memory_used_mib: Value = 1024
    memory_reserved_mib: int = 0  # reported apart by MemoryInfo_v2, counted in `used` by v1
    power_w: Value = 350.0
    sm_clock_mhz: Value = 1980
    temperature_c: Value = 45
    pcie_tx_kbps: Value = 1000
    pcie_rx_kbps: Value = 2000
    clocks_event_reasons: int | Callable[[float], int] = 0
    gpm_supported: bool = True
    # GPM metrics, averaged over the two samples' interval; None answers NOT_SUPPORTED for that metric.
    sm_util_pct: Value | None = 80.0
    sm_occupancy_pct: Value | None = 40.0
    tensor_util_pct: Value | None = 30.0
    dram_bw_util_pct: Value | None = 50.0
    pids: list[int] = field(default_factory=list)  # compute processes on this GPU
    process_used_mib: int = 1024  # used GPU memory reported for each of `pids`
    process_query_error: int | None = None  # e.g. NVML_ERROR_NO_PERMISSION: the process list fails
    no_permission: bool = False  # counted by GetCount, but its handle answers NO_PERMISSION (cgroup)
    utilization_supported: bool = True  # False: GetSamples/GetUtilizationRates answer NOT_SUPPORTED
    # Cumulative PCIe bytes as functions of host time (field values 197/198); None integrates the KB/s rates.
    pcie_tx_total_bytes: Callable[[float], float] | None = None
    pcie_rx_total_bytes: Callable[[float], float] | None = None
    # MIG instances: non-empty means MIG mode is on, and then utilization is not supported on the GPU.
    mig: list[FakeMig] = field(default_factory=list)


@dataclass
class FakeMig:
    """A MIG device (one GPU instance with one compute instance) inside a FakeGpu."""

    uuid: str = ""  # FakeNvmlLib fills in "MIG-<gpu>-<slot>..." when empty
    gpu_instance_id: int = 1
    compute_instance_id: int = 0
    name: str = "NVIDIA H200 MIG 1g.18gb"
    memory_total_mib: int = 16384
    memory_used_mib: Value = 512
    sm_util_pct: Value | None = 70.0  # per-instance GPM (nvmlGpmMigSampleGet)
    sm_occupancy_pct: Value | None = 35.0
    tensor_util_pct: Value | None = 20.0
    dram_bw_util_pct: Value | None = 40.0


class ManualClock:
    """A clock for `FakeNvmlLib(clock=...)` that only moves when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class _GpmSample:
    buffer: pynvml.struct_c_nvmlGpmSample_t
    gpu: FakeGpu | FakeMig | None = None  # set by nvmlGpmSampleGet / nvmlGpmMigSampleGet
    time: float = 0.0


def bare_uuid(uuid: str) -> str:
    """The UUID as CUDA's cuDeviceGetUuid_v2 gives it: hex groups without the GPU-/MIG- prefix."""
    return uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid


def _at(value: Value, t: float) -> float:
    return value(t) if callable(value) else value


def _mean(value: Value, t1: float, t2: float, points: int = 16) -> float:
    return sum(_at(value, t1 + (t2 - t1) * (i + 0.5) / points) for i in range(points)) / points


def _deref(ref: Any) -> Any:
    """The ctypes object behind a `byref()` argument."""
    return ref._obj


def _address(pointer: object) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value


def _put_str(buffer: ctypes.Array, size: ctypes.c_uint, text: str) -> int:
    data = text.encode()
    if len(data) >= size.value:
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    buffer.value = data
    return pynvml.NVML_SUCCESS


def _device_function(impl: Callable[..., int]) -> Callable[..., int]:
    """Marks a C function whose first argument is a GPU handle; the impl gets its FakeGpu instead.

    On a MIG device handle such a function answers NOT_SUPPORTED."""

    @functools.wraps(impl)
    def resolved(self: FakeNvmlLib, now: float, handle: object, *args: object) -> int:
        owner = self._handle_owner.get(_address(handle))
        if owner is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if isinstance(owner, FakeMig):
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        return impl(self, now, owner, *args)

    return resolved


def _any_device_function(impl: Callable[..., int]) -> Callable[..., int]:
    """Marks a C function that takes a GPU or a MIG device handle; the impl gets its FakeGpu or FakeMig."""

    @functools.wraps(impl)
    def resolved(self: FakeNvmlLib, now: float, handle: object, *args: object) -> int:
        owner = self._handle_owner.get(_address(handle))
        if owner is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return impl(self, now, owner, *args)

    return resolved


class FakeNvmlLib:
    """Stands in for `CDLL("libnvidia-ml.so.1")`: attribute `nvmlXxx` is the C function of that name.

    Every C function answers UNINITIALIZED outside nvmlInitWithFlags/nvmlShutdown pairs, then
    GPU_IS_LOST from `clock() >= lost_after` on (all but the `_HOST_FUNCTIONS`), then NOT_SUPPORTED
    if named in `unsupported`. Names in `missing` are absent (checked when pynvml first looks them
    up, as it caches function pointers). `gpus`, `lost_after` and `unsupported` may be changed while
    installed. `calls` counts C calls as they return, `started` as they are made (a hanging call is started but not
yet counted): pynvml's two-call wrappers count twice.

    Hard cases: `failing` makes the named C functions answer that error code; `latency_s` makes them
    take that long (outside the lib's lock, so a "hanging" call does not block the others);
    `dry_below_pct` leaves out of the sample buffer every sample at or below that utilization (products
    whose buffer runs dry while idle); `step_clock()` moves the timestamp epoch (an NTP step);
    FakeGpu.mig, .no_permission and .process_query_error script MIG, cgroup-restricted GPUs and
    unprivileged process queries.
    """

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver_version: str = "560.35.03",
        sample_period_s: float = 1 / 6,
        buffer_size: int = 100,
        timestamp_offset_us: int | None = None,
        unsupported: frozenset[str] | set[str] = frozenset(),
        missing: frozenset[str] | set[str] = frozenset(),
        lost_after: float | None = None,
        latency_s: dict[str, float] | None = None,
        failing: dict[str, int] | None = None,
        dry_below_pct: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for index, gpu in enumerate(gpus):
            gpu.uuid = gpu.uuid or f"GPU-{index:08x}-0000-4000-8000-000000000000"
            for slot, mig in enumerate(gpu.mig):
                mig.uuid = mig.uuid or f"MIG-{index:08x}-{slot:04x}-5000-8000-000000000000"
        self.gpus = gpus
        self.driver_version = driver_version
        self.sample_period_us = round(sample_period_s * 1e6)
        self.buffer_size = buffer_size
        self.clock = clock
        self.timestamp_offset_us = (
            FAKE_UPTIME_US - round(clock() * 1e6) if timestamp_offset_us is None else timestamp_offset_us
        )
        self.unsupported = unsupported
        self.missing = missing
        self.lost_after = lost_after
        self.latency_s = dict(latency_s or {})
        self.failing = dict(failing or {})  # C function name -> nvmlReturn_t it answers (e.g. UNKNOWN)
        self.dry_below_pct = dry_below_pct
        self.calls: collections.Counter[str] = collections.Counter()
        self.started: collections.Counter[str] = collections.Counter()
        self.init_count = 0
        self._lock = threading.Lock()
        self._handles = [pynvml.struct_c_nvmlDevice_t() for _ in gpus]
        self._mig_handles = {(i, k): pynvml.struct_c_nvmlDevice_t() for i, g in enumerate(gpus) for k in
                             range(len(g.mig))}
        self._handle_owner: dict[int, FakeGpu | FakeMig] = {ctypes.addressof(h): g for h, g in
                                                             zip(self._handles, gpus)}
        self._handle_owner.update({ctypes.addressof(h): gpus[i].mig[k] for (i, k), h in self._mig_handles.items()})
        self._gpm_samples: dict[int, _GpmSample] = {}
        self._pcie_totals: dict[tuple[int, int], tuple[float, float]] = {}  # (gpu id, field) -> (time, bytes)

    def step_clock(self, seconds: float) -> None:
        """Moves the NVML timestamp epoch by `seconds` (negative: the clock steps back), as an NTP step does."""
        self.timestamp_offset_us += round(seconds * 1e6)

    @property
    def gpm_samples_allocated(self) -> int:
        """GPM samples allocated and not yet freed."""
        return len(self._gpm_samples)

    def _parent_of(self, mig: FakeMig) -> tuple[int, FakeGpu]:
        return next((i, g) for i, g in enumerate(self.gpus) if any(m is mig for m in g.mig))

    def timestamp_of(self, host_time: float) -> int:
        """The opaque NVML timestamp (µs) for a host `clock()` time."""
        return round(host_time * 1e6) + self.timestamp_offset_us

    def host_time_of(self, timestamp_us: int) -> float:
        """The host `clock()` time of an NVML timestamp."""
        return (timestamp_us - self.timestamp_offset_us) / 1e6

    def __getattr__(self, name: str) -> Callable[..., int]:
        if not name.startswith("nvml") or name in self.missing or not hasattr(type(self), "_" + name):
            raise AttributeError(name)
        return functools.partial(self._call, name)

    def _call(self, name: str, *args: object) -> int:
        with self._lock:
            self.started[name] += 1
        if self.latency_s.get(name):
            time.sleep(self.latency_s[name])
        with self._lock:
            self.calls[name] += 1
            now = self.clock()
            if self.init_count == 0 and name != "nvmlInitWithFlags":
                return pynvml.NVML_ERROR_UNINITIALIZED
            if name not in _HOST_FUNCTIONS and self.lost_after is not None and now >= self.lost_after:
                return pynvml.NVML_ERROR_GPU_IS_LOST
            if name in self.unsupported:
                return pynvml.NVML_ERROR_NOT_SUPPORTED
            if name in self.failing:
                return self.failing[name]
            return getattr(self, "_" + name)(now, *args)

    def _sample_stamps(self, now: float, last_seen: int) -> list[int]:
        """Grid timestamps newer than `last_seen` still in the ring buffer, oldest first."""
        period = self.sample_period_us
        newest = self.timestamp_of(now) // period
        first = max(newest - self.buffer_size + 1, last_seen // period + 1)
        return [k * period for k in range(first, newest + 1)]

    def _utilization_sample(self, gpu: FakeGpu, timestamp_us: int) -> int:
        return round(_at(gpu.utilization, self.host_time_of(timestamp_us)))

    def _in_buffer(self, gpu: FakeGpu, timestamp_us: int) -> bool:
        return self.dry_below_pct is None or self._utilization_sample(gpu, timestamp_us) > self.dry_below_pct

    def _pcie_total(self, gpu: FakeGpu, field_id: int, now: float) -> float:
        """Cumulative bytes: the scripted counter, or the KB/s rate integrated on a 1 ms grid."""
        tx = field_id == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
        counter = gpu.pcie_tx_total_bytes if tx else gpu.pcie_rx_total_bytes
        if counter is not None:
            return counter(now)
        rate = gpu.pcie_tx_kbps if tx else gpu.pcie_rx_kbps
        last_time, total = self._pcie_totals.get((id(gpu), field_id), (now, 0.0))
        if now > last_time:
            points = min(5000, max(1, int((now - last_time) * 1000)))
            total += _mean(rate, last_time, now, points) * 1024 * (now - last_time)
        self._pcie_totals[(id(gpu), field_id)] = (now, total)
        return total

    # --- C functions: `_<C name>(now, *C arguments as pynvml passes them) -> nvmlReturn_t` ---

    def _nvmlInitWithFlags(self, now: float, flags: int) -> int:
        self.init_count += 1
        return pynvml.NVML_SUCCESS

    def _nvmlShutdown(self, now: float) -> int:
        self.init_count -= 1
        return pynvml.NVML_SUCCESS

    def _nvmlSystemGetDriverVersion(self, now: float, buffer: ctypes.Array, size: ctypes.c_uint) -> int:
        return _put_str(buffer, size, self.driver_version)

    def _nvmlDeviceGetCount_v2(self, now: float, count_ref: object) -> int:
        _deref(count_ref).value = len(self.gpus)
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, now: float, index: ctypes.c_uint, device_ref: object) -> int:
        if index.value >= len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if self.gpus[index.value].no_permission:
            return pynvml.NVML_ERROR_NO_PERMISSION
        _deref(device_ref).contents = self._handles[index.value]
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetHandleByUUID(self, now: float, uuid: ctypes.c_char_p, device_ref: object) -> int:
        """Exact full UUIDs only, GPU or MIG, as the real call (no short prefixes)."""
        for address, owner in self._handle_owner.items():
            if owner.uuid.encode() == uuid.value:
                if isinstance(owner, FakeGpu) and owner.no_permission:
                    return pynvml.NVML_ERROR_NO_PERMISSION
                _deref(device_ref).contents = next(h for h in [*self._handles, *self._mig_handles.values()]
                                                   if ctypes.addressof(h) == address)
                return pynvml.NVML_SUCCESS
        return pynvml.NVML_ERROR_NOT_FOUND

    @_any_device_function
    def _nvmlDeviceGetName(self, now: float, gpu: FakeGpu | FakeMig, buffer: ctypes.Array,
                           size: ctypes.c_uint) -> int:
        return _put_str(buffer, size, gpu.name)

    @_any_device_function
    def _nvmlDeviceGetUUID(self, now: float, gpu: FakeGpu | FakeMig, buffer: ctypes.Array,
                           size: ctypes.c_uint) -> int:
        return _put_str(buffer, size, gpu.uuid)

    @_any_device_function
    def _nvmlDeviceGetIndex(self, now: float, gpu: FakeGpu | FakeMig, index_ref: object) -> int:
        """A MIG handle answers its index inside the parent GPU, as the real call does."""
        if isinstance(gpu, FakeMig):
            _deref(index_ref).value = self._parent_of(gpu)[1].mig.index(gpu)
        else:
            _deref(index_ref).value = next(i for i, g in enumerate(self.gpus) if g is gpu)
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetMigMode(self, now: float, gpu: FakeGpu, current_ref: object, pending_ref: object) -> int:
        _deref(current_ref).value = _deref(pending_ref).value = int(bool(gpu.mig))
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetMaxMigDeviceCount(self, now: float, gpu: FakeGpu, count_ref: object) -> int:
        _deref(count_ref).value = 7 if gpu.mig else 0
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetMigDeviceHandleByIndex(self, now: float, gpu: FakeGpu, index: ctypes.c_uint,
                                             device_ref: object) -> int:
        if index.value >= len(gpu.mig):
            return pynvml.NVML_ERROR_NOT_FOUND
        _deref(device_ref).contents = self._mig_handles[(self.gpus.index(gpu), index.value)]
        return pynvml.NVML_SUCCESS

    @_any_device_function
    def _nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, now: float, mig: FakeGpu | FakeMig,
                                                      device_ref: object) -> int:
        if not isinstance(mig, FakeMig):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _deref(device_ref).contents = self._handles[self._parent_of(mig)[0]]
        return pynvml.NVML_SUCCESS

    @_any_device_function
    def _nvmlDeviceIsMigDeviceHandle(self, now: float, gpu: FakeGpu | FakeMig, is_mig_ref: object) -> int:
        _deref(is_mig_ref).value = int(isinstance(gpu, FakeMig))
        return pynvml.NVML_SUCCESS

    @_any_device_function
    def _nvmlDeviceGetGpuInstanceId(self, now: float, mig: FakeGpu | FakeMig, id_ref: object) -> int:
        if not isinstance(mig, FakeMig):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _deref(id_ref).value = mig.gpu_instance_id
        return pynvml.NVML_SUCCESS

    @_any_device_function
    def _nvmlDeviceGetComputeInstanceId(self, now: float, mig: FakeGpu | FakeMig, id_ref: object) -> int:
        if not isinstance(mig, FakeMig):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _deref(id_ref).value = mig.compute_instance_id
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetSamples(
        self,
        now: float,
        gpu: FakeGpu,
        sampling_type: ctypes.c_uint,
        last_seen: ctypes.c_ulonglong,
        value_type_ref: object,
        count_ref: object,
        samples: ctypes.Array | None,
    ) -> int:
        """First call (samples NULL) sizes, second fills; both answer NOT_FOUND when nothing is new."""
        if sampling_type.value != pynvml.NVML_GPU_UTILIZATION_SAMPLES or gpu.mig or not gpu.utilization_supported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        stamps = [s for s in self._sample_stamps(now, last_seen.value) if self._in_buffer(gpu, s)]
        if not stamps:
            return pynvml.NVML_ERROR_NOT_FOUND
        _deref(value_type_ref).value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        count = _deref(count_ref)
        if samples is not None:
            stamps = stamps[: min(count.value, len(samples))]  # oldest first, so the caller misses none
            for sample, stamp in zip(samples, stamps):
                sample.timeStamp = stamp
                sample.sampleValue.uiVal = self._utilization_sample(gpu, stamp)
        count.value = len(stamps)
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetUtilizationRates(self, now: float, gpu: FakeGpu, util_ref: object) -> int:
        if gpu.mig or not gpu.utilization_supported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        util = _deref(util_ref)
        newest_stamp = self.timestamp_of(now) // self.sample_period_us * self.sample_period_us
        util.gpu = self._utilization_sample(gpu, newest_stamp)
        util.memory = round(_at(gpu.memory_utilization, now))
        return pynvml.NVML_SUCCESS

    @_any_device_function
    def _nvmlDeviceGetMemoryInfo(self, now: float, gpu: FakeGpu | FakeMig, memory_ref: object) -> int:
        memory = _deref(memory_ref)
        if isinstance(gpu, FakeMig):
            memory.total, memory.used = gpu.memory_total_mib * MIB, round(_at(gpu.memory_used_mib, now)) * MIB
            memory.free = memory.total - memory.used
            return pynvml.NVML_SUCCESS
        used_mib = round(_at(gpu.memory_used_mib, now)) + gpu.memory_reserved_mib
        memory.total, memory.used = gpu.memory_total_mib * MIB, used_mib * MIB
        memory.free = memory.total - memory.used
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetMemoryInfo_v2(self, now: float, gpu: FakeGpu, memory_ref: object) -> int:
        memory = _deref(memory_ref)
        if memory.version != pynvml.nvmlMemory_v2:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        memory.total, memory.reserved = gpu.memory_total_mib * MIB, gpu.memory_reserved_mib * MIB
        memory.used = round(_at(gpu.memory_used_mib, now)) * MIB
        memory.free = memory.total - memory.reserved - memory.used
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetPowerUsage(self, now: float, gpu: FakeGpu, milliwatts_ref: object) -> int:
        _deref(milliwatts_ref).value = round(_at(gpu.power_w, now) * 1000)
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetClockInfo(
        self, now: float, gpu: FakeGpu, clock_type: ctypes.c_uint, mhz_ref: object
    ) -> int:
        if clock_type.value != pynvml.NVML_CLOCK_SM:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        _deref(mhz_ref).value = round(_at(gpu.sm_clock_mhz, now))
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetTemperature(
        self, now: float, gpu: FakeGpu, sensor: ctypes.c_uint, celsius_ref: object
    ) -> int:
        if sensor.value != pynvml.NVML_TEMPERATURE_GPU:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _deref(celsius_ref).value = round(_at(gpu.temperature_c, now))
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetTemperatureV(self, now: float, gpu: FakeGpu, temperature_ref: object) -> int:
        temperature = _deref(temperature_ref)
        if temperature.version != pynvml.nvmlTemperature_v1:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if temperature.sensorType != pynvml.NVML_TEMPERATURE_GPU:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        temperature.temperature = round(_at(gpu.temperature_c, now))
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetPcieThroughput(
        self, now: float, gpu: FakeGpu, counter: ctypes.c_uint, kbps_ref: object
    ) -> int:
        """KB/s over the last 20 ms: a snapshot that misses whatever moved outside that window."""
        rates = {
            pynvml.NVML_PCIE_UTIL_TX_BYTES: (gpu.pcie_tx_kbps, gpu.pcie_tx_total_bytes),
            pynvml.NVML_PCIE_UTIL_RX_BYTES: (gpu.pcie_rx_kbps, gpu.pcie_rx_total_bytes),
        }
        if counter.value not in rates:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        rate, total = rates[counter.value]
        kbps = (total(now) - total(now - 0.02)) / 0.02 / 1024 if total is not None else _at(rate, now)
        _deref(kbps_ref).value = round(kbps)
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetFieldValues(self, now: float, gpu: FakeGpu, count: ctypes.c_int32, values_ref: object) -> int:
        """Field values 197/198 (cumulative PCIe TX/RX bytes); other fields answer NOT_SUPPORTED per field."""
        counters = (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
        for value in _deref(values_ref)[: count.value]:
            value.timestamp = self.timestamp_of(now)
            if value.fieldId in counters:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = round(self._pcie_total(gpu, value.fieldId, now))
                value.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetCurrentClocksEventReasons(self, now: float, gpu: FakeGpu, reasons_ref: object) -> int:
        _deref(reasons_ref).value = int(_at(gpu.clocks_event_reasons, now))
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, now: float, gpu: FakeGpu, reasons_ref: object) -> int:
        """The pre-R535 name of GetCurrentClocksEventReasons (same bits)."""
        _deref(reasons_ref).value = int(_at(gpu.clocks_event_reasons, now))
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlDeviceGetComputeRunningProcesses_v3(
        self, now: float, gpu: FakeGpu, count_ref: object, infos: ctypes.Array | None
    ) -> int:
        if gpu.process_query_error is not None:
            return gpu.process_query_error
        count = _deref(count_ref)
        if count.value < len(gpu.pids):
            count.value = len(gpu.pids)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for info, pid in zip(infos or (), gpu.pids):
            info.pid, info.usedGpuMemory = pid, gpu.process_used_mib * MIB
            info.gpuInstanceId = info.computeInstanceId = pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value
        count.value = len(gpu.pids)
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlGpmQueryDeviceSupport(self, now: float, gpu: FakeGpu, support_ref: object) -> int:
        support = _deref(support_ref)
        if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        support.isSupportedDevice = int(gpu.gpm_supported)
        return pynvml.NVML_SUCCESS

    def _nvmlGpmSampleAlloc(self, now: float, sample_ref: object) -> int:
        sample = _GpmSample(pynvml.struct_c_nvmlGpmSample_t())
        self._gpm_samples[ctypes.addressof(sample.buffer)] = sample
        _deref(sample_ref).contents = sample.buffer
        return pynvml.NVML_SUCCESS

    def _nvmlGpmSampleFree(self, now: float, pointer: object) -> int:
        if self._gpm_samples.pop(_address(pointer), None) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlGpmSampleGet(self, now: float, gpu: FakeGpu, pointer: object) -> int:
        sample = self._gpm_samples.get(_address(pointer))
        if sample is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if not gpu.gpm_supported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        sample.gpu, sample.time = gpu, now
        return pynvml.NVML_SUCCESS

    @_device_function
    def _nvmlGpmMigSampleGet(self, now: float, gpu: FakeGpu, gpu_instance_id: int, pointer: object) -> int:
        """Per-MIG-instance GPM sample, taken on the parent GPU's handle (as DCGM does)."""
        sample = self._gpm_samples.get(_address(pointer))
        if sample is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if not gpu.gpm_supported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        instance_id = getattr(gpu_instance_id, "value", gpu_instance_id)
        mig = next((m for m in gpu.mig if m.gpu_instance_id == instance_id), None)
        if mig is None:
            return pynvml.NVML_ERROR_NOT_FOUND
        sample.gpu, sample.time = mig, now
        return pynvml.NVML_SUCCESS

    def _nvmlGpmMetricsGet(self, now: float, request_ref: object) -> int:
        request = _deref(request_ref)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        first, second = (self._gpm_samples.get(_address(p)) for p in (request.sample1, request.sample2))
        if first is None or second is None or first.gpu is None or first.gpu is not second.gpu:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if request.numMetrics > pynvml.NVML_GPM_METRIC_MAX:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        for metric in request.metrics[: request.numMetrics]:
            source = getattr(first.gpu, _GPM_METRIC_FIELDS.get(metric.metricId, ""), None)
            if source is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, _mean(source, first.time, second.time)
        return pynvml.NVML_SUCCESS


@contextlib.contextmanager
def _pynvml_state(nvml_lib: object) -> Iterator[None]:
    """Loads `nvml_lib` as pynvml's library with a fresh init refcount; restores the previous state after."""
    with pynvml.libLoadLock:
        saved = pynvml.nvmlLib, pynvml._nvmlLib_refcount
        pynvml.nvmlLib, pynvml._nvmlLib_refcount = nvml_lib, 0
        pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield
    finally:
        with pynvml.libLoadLock:
            pynvml.nvmlLib, pynvml._nvmlLib_refcount = saved
            pynvml._nvmlGetFunctionPointer_cache.clear()


@contextlib.contextmanager
def installed(lib: FakeNvmlLib) -> Iterator[FakeNvmlLib]:
    """Makes `lib` the library behind the real pynvml, with a fresh init refcount.

    On exit pynvml's previous library and refcount come back, even if NVML was left initialised.
    """
    with _pynvml_state(lib):
        yield lib


@contextlib.contextmanager
def library_missing() -> Iterator[None]:
    """Makes `pynvml.nvmlInit()` raise NVMLError_LibraryNotFound, even where libnvidia-ml exists."""
    no_library = OSError("libnvidia-ml.so.1: cannot open shared object file (fake_nvml.library_missing)")
    with mock.patch.object(pynvml, "CDLL", side_effect=no_library), _pynvml_state(None):
        yield
