"""Self-test of fake_nvml: every scripted C function, driven through the real pynvml wrappers."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator

import pynvml
import pytest
from fake_nvml import FakeGpu, FakeNvmlLib, ManualClock, installed, library_missing

MIB = 1 << 20


def utilization(t: float) -> float:
    return (t * 10) % 100


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def lib(clock: ManualClock) -> FakeNvmlLib:
    return FakeNvmlLib(
        [
            FakeGpu(utilization=utilization, pids=[os.getpid(), 4242], memory_reserved_mib=500),
            FakeGpu(name="NVIDIA A100", uuid="GPU-a100"),
        ],
        clock=clock,
    )


@pytest.fixture
def nvml(lib: FakeNvmlLib) -> Iterator[FakeNvmlLib]:
    with installed(lib):
        pynvml.nvmlInit()
        yield lib


def test_identity(nvml: FakeNvmlLib) -> None:
    assert pynvml.nvmlSystemGetDriverVersion() == "560.35.03"
    assert pynvml.nvmlDeviceGetCount() == 2
    first, second = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetName(first) == "NVIDIA H200"
    assert pynvml.nvmlDeviceGetName(second) == "NVIDIA A100"
    assert pynvml.nvmlDeviceGetUUID(first) == nvml.gpus[0].uuid != pynvml.nvmlDeviceGetUUID(second)
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID("GPU-a100")) == 1
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(nvml.gpus[0].uuid)) == 0
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-nope")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.calls["nvmlDeviceGetName"] == 2


def test_init_refcount_and_uninitialized(lib: FakeNvmlLib) -> None:
    with installed(lib):
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        assert pynvml.nvmlDeviceGetCount() == 2
        pynvml.nvmlShutdown()
        assert lib.init_count == 0
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()


def test_samples_are_incremental_and_calibrated(nvml: FakeNvmlLib, clock: ManualClock) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    value_type, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert len(samples) == 100
    stamps = [s.timeStamp for s in samples]
    assert {b - a for a, b in itertools.pairwise(stamps)} == {nvml.sample_period_us}
    assert abs(stamps[-1] / 1e6 - clock()) > 1e6  # opaque epoch, not Unix time
    assert clock() - 1 / 6 < nvml.host_time_of(stamps[-1]) <= clock()
    assert nvml.timestamp_of(nvml.host_time_of(stamps[-1])) == stamps[-1]
    for s in samples:
        assert s.sampleValue.uiVal == round(utilization(nvml.host_time_of(s.timeStamp)))

    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])
    clock.advance(1.0)
    _, newer = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])
    assert len(newer) == 6 and all(s.timeStamp > stamps[-1] for s in newer)
    clock.advance(100.0)
    _, after_gap = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])
    assert len(after_gap) == 100  # the ring buffer dropped the rest


def test_device_metrics(nvml: FakeNvmlLib, clock: ManualClock) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
    _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert (rates.gpu, rates.memory) == (samples[-1].sampleValue.uiVal, 30)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    assert (v1.total, v1.used, v1.free) == (143771 * MIB, 1524 * MIB, (143771 - 1524) * MIB)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.used, v2.free) == (143771 * MIB, 500 * MIB, 1024 * MIB, 142247 * MIB)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 350_000
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 45
    assert pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU) == 45
    assert pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 1000
    assert pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 2000
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory) for p in processes] == [(os.getpid(), 1024 * MIB), (4242, 1024 * MIB)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(1)) == []


def gpm_metrics(handle: object, clock: ManualClock, metric_ids: list[int]) -> dict[int, tuple[int, float]]:
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(handle, first)
    clock.advance(1.0)
    pynvml.nvmlGpmSampleGet(handle, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metric_ids)
    request.sample1, request.sample2 = first, second
    for metric, metric_id in zip(request.metrics, metric_ids):
        metric.metricId = metric_id
    pynvml.nvmlGpmMetricsGet(request)
    pynvml.nvmlGpmSampleFree(first)
    pynvml.nvmlGpmSampleFree(second)
    return {m.metricId: (m.nvmlReturn, m.value) for m in request.metrics[: len(metric_ids)]}


def test_gpm(nvml: FakeNvmlLib, clock: ManualClock) -> None:
    start = clock()
    nvml.gpus[0].sm_util_pct = lambda t: 60.0 if t < start + 0.5 else 100.0
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
    metrics = gpm_metrics(
        handle,
        clock,
        [
            pynvml.NVML_GPM_METRIC_SM_UTIL,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
            pynvml.NVML_GPM_METRIC_FP32_UTIL,
        ],
    )
    assert metrics == {
        pynvml.NVML_GPM_METRIC_SM_UTIL: (pynvml.NVML_SUCCESS, 80.0),  # averaged over the interval
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: (pynvml.NVML_SUCCESS, 40.0),
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: (pynvml.NVML_SUCCESS, 30.0),
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: (pynvml.NVML_SUCCESS, 50.0),
        pynvml.NVML_GPM_METRIC_FP32_UTIL: (pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0),
    }


def test_gpm_unsupported_device(nvml: FakeNvmlLib) -> None:
    nvml.gpus[1].gpm_supported = False
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 0
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(handle, sample)
    pynvml.nvmlGpmSampleFree(sample)


def test_unsupported_and_missing_functions(clock: ManualClock) -> None:
    lib = FakeNvmlLib(
        [FakeGpu()],
        clock=clock,
        unsupported={"nvmlDeviceGetPowerUsage"},
        missing={"nvmlDeviceGetCurrentClocksEventReasons"},
    )
    with installed(lib):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetPowerUsage(handle)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 45


def test_gpu_lost(clock: ManualClock) -> None:
    lib = FakeNvmlLib([FakeGpu()], clock=clock, lost_after=clock() + 5)
    with installed(lib):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetPowerUsage(handle) == 350_000
        clock.advance(5)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetPowerUsage(handle)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        assert pynvml.nvmlDeviceGetCount() == 1
        pynvml.nvmlShutdown()


def assert_pristine() -> None:
    assert pynvml.nvmlLib is None
    assert pynvml._nvmlLib_refcount == 0
    assert pynvml._nvmlGetFunctionPointer_cache == {}


def test_installed_restores_state_when_left_initialised(lib: FakeNvmlLib) -> None:
    with installed(lib):
        pynvml.nvmlInit()
        assert pynvml.nvmlLib is lib and pynvml._nvmlLib_refcount == 1
    assert_pristine()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_library_missing(lib: FakeNvmlLib) -> None:
    with library_missing(), pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    assert_pristine()
    with installed(lib):  # stands in for a loaded real library
        with library_missing(), pytest.raises(pynvml.NVMLError_LibraryNotFound):
            pynvml.nvmlInit()
        assert pynvml.nvmlLib is lib


def test_concurrent_calls_are_counted(nvml: FakeNvmlLib) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def poll() -> None:
        for _ in range(200):
            pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)

    threads = [threading.Thread(target=poll) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert nvml.calls["nvmlDeviceGetSamples"] == 2 * 800  # pynvml sizes, then fills
