"""What the NVIDIA driver on this machine really does, and whether rnnmon gets a real fit right on it.

Run on any machine with an NVIDIA GPU and this project installed (nothing else):

    python benchmarks/gpu_check.py              # driver facts, then a short LSTM fit with a 2 s input stall
    python benchmarks/gpu_check.py --skip-fit   # driver facts only

It prints, per GPU: the utilization sample buffer's depth and period; the sample timestamps against
`time.time()`, CLOCK_MONOTONIC and CLOCK_BOOTTIME (which clock NVML stamps with); the latency of every NVML call
rnnmon makes; GPM support and latency; and CUDA's device order against NVML's. Then it trains a small LSTM on
the installed Keras backend with rnnmon watching, stalls the input for 2 s in the middle, and checks
(docs/gpu.md): samples are recorded at the driver's rate; utilization is above 0 during compute; one idle gap
blamed on the input covers the stall within ±0.5 s. Exit status: 0 all checks pass, 1 a check failed,
2 no NVIDIA GPU here.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

STALL_S = 2.0
TOLERANCE_S = 0.5
_FIELDS = (198, 197)  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES


def main(argv: list[str] | None = None, cuda: Callable[[], list[str] | None] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-fit", action="store_true", help="driver facts only, no training run")
    parser.add_argument("--repeats", type=int, default=20, help="calls per NVML function timed (default 20)")
    parser.add_argument("--wait-s", type=float, default=3.0, help="seconds between two buffer reads (default 3)")
    args = parser.parse_args(argv)

    import pynvml

    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        print(f"gpu_check: no NVIDIA GPU here: NVML did not start ({type(error).__name__}: {error}). "
              "Run this on a machine with an NVIDIA driver and GPU.")
        return 2
    try:
        if count == 0:
            print("gpu_check: NVML runs but lists no GPU. Run this on a machine with an NVIDIA GPU.")
            return 2
        print(f"NVML driver {_call(pynvml.nvmlSystemGetDriverVersion)}, {count} GPU(s); "
              f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, "
              f"CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER')!r}")
        periods = {}
        for index in range(count):
            periods[index] = _check_device(pynvml, index, args.repeats, args.wait_s)
        _check_order(pynvml, count, cuda if cuda is not None else _cuda_uuids)
    finally:
        pynvml.nvmlShutdown()
    if args.skip_fit:
        return 0
    return 0 if _check_fit(periods) else 1


# --- driver facts ---------------------------------------------------------------------------------------------

def _check_device(pynvml: Any, index: int, repeats: int, wait_s: float) -> float | None:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as error:
        print(f"\nGPU {index}: no handle ({error}): rnnmon skips it (a cgroup may hide it)")
        return None
    print(f"\nGPU {index}: {_call(pynvml.nvmlDeviceGetName, handle)}  {_call(pynvml.nvmlDeviceGetUUID, handle)}"
          f"  MIG mode {_call(pynvml.nvmlDeviceGetMigMode, handle)}")
    period = _check_buffer(pynvml, handle, wait_s)
    print("  latency of each NVML call rnnmon makes (median of repeats):")
    for name, call in _calls(pynvml, handle, index).items():
        print(f"    {name:58s} {_latency(call, repeats)}")
    _check_gpm(pynvml, handle)
    _check_mig(pynvml, handle)
    return period


def _check_buffer(pynvml: Any, handle: Any, wait_s: float) -> float | None:
    kind = pynvml.NVML_GPU_UTILIZATION_SAMPLES
    try:
        _, first = pynvml.nvmlDeviceGetSamples(handle, kind, 0)
    except pynvml.NVMLError as error:
        print(f"  utilization sample buffer: {error} (rnnmon falls back to GetUtilizationRates or GPM)")
        return None
    stamps = sorted(s.timeStamp for s in first)
    if len(stamps) < 2:
        print(f"  utilization sample buffer: {len(stamps)} sample(s): empty while idle?")
        return None
    period_s = statistics.median(b - a for a, b in itertools.pairwise(stamps)) / 1e6
    newest = stamps[-1] / 1e6
    print(f"  buffer: {len(stamps)} samples spanning {(stamps[-1] - stamps[0]) / 1e6:.1f} s, period "
          f"{period_s * 1e3:.1f} ms ({1 / period_s:.2f}/s); values {min(s.sampleValue.uiVal for s in first)}.."
          f"{max(s.sampleValue.uiVal for s in first)}")
    clocks = {"time.time()": time.time(), "CLOCK_MONOTONIC": time.clock_gettime(time.CLOCK_MONOTONIC)}
    if hasattr(time, "CLOCK_BOOTTIME"):
        clocks["CLOCK_BOOTTIME"] = time.clock_gettime(time.CLOCK_BOOTTIME)
    print("  newest timestamp minus " + ", ".join(f"{name} = {newest - now:+.3f} s" for name, now in clocks.items()))
    time.sleep(wait_s)
    try:
        _, later = pynvml.nvmlDeviceGetSamples(handle, kind, stamps[-1])
        fresh = len(later)
    except pynvml.NVMLError as error:  # NOT_FOUND: nothing new (a buffer that runs dry while idle)
        fresh = f"0 ({error})"
    print(f"  {fresh} new samples after {wait_s:.1f} s (expected ~{wait_s / period_s:.0f} while the GPU is busy)")
    return period_s


def _calls(pynvml: Any, handle: Any, index: int) -> dict[str, Callable[[], Any]]:
    def gpm_support() -> Any:
        return pynvml.nvmlGpmQueryDeviceSupport(handle)

    return {
        "nvmlDeviceGetHandleByIndex": lambda: pynvml.nvmlDeviceGetHandleByIndex(index),
        "nvmlDeviceGetName": lambda: pynvml.nvmlDeviceGetName(handle),
        "nvmlDeviceGetUUID": lambda: pynvml.nvmlDeviceGetUUID(handle),
        "nvmlDeviceGetMigMode": lambda: pynvml.nvmlDeviceGetMigMode(handle),
        "nvmlDeviceGetSamples(GPU_UTILIZATION, 0)": lambda: pynvml.nvmlDeviceGetSamples(
            handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetClockInfo(SM)": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "nvmlDeviceGetTemperature(GPU)": lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetFieldValues(PCIE_COUNT_RX/TX_BYTES)": lambda: _field_values(pynvml, handle),
        "nvmlDeviceGetPcieThroughput(RX) [fallback]": lambda: pynvml.nvmlDeviceGetPcieThroughput(
            handle, pynvml.NVML_PCIE_UTIL_RX_BYTES),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "nvmlDeviceGetCurrentClocksThrottleReasons [old drivers]": lambda: (
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
        "nvmlDeviceGetComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
        "nvmlGpmQueryDeviceSupport": gpm_support,
    }


def _field_values(pynvml: Any, handle: Any) -> list[int]:
    values = pynvml.nvmlDeviceGetFieldValues(handle, list(_FIELDS))
    failed = [v.nvmlReturn for v in values if v.nvmlReturn != 0]
    if failed:
        raise pynvml.NVMLError(failed[0])
    return [v.value.ullVal for v in values]


def _check_gpm(pynvml: Any, handle: Any) -> None:
    try:
        supported = pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice
    except pynvml.NVMLError as error:
        print(f"  GPM: {error}")
        return
    if not supported:
        print("  GPM: not supported on this GPU (SM activity stays NA)")
        return
    samples = [pynvml.nvmlGpmSampleAlloc() for _ in range(2)]
    try:
        started = time.perf_counter()
        pynvml.nvmlGpmSampleGet(handle, samples[0])
        get_ms = (time.perf_counter() - started) * 1e3
        time.sleep(0.2)  # nvml.h: more than 100 ms apart
        pynvml.nvmlGpmSampleGet(handle, samples[1])
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = samples
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        started = time.perf_counter()
        pynvml.nvmlGpmMetricsGet(request)
        metrics_ms = (time.perf_counter() - started) * 1e3
        print(f"  GPM: supported; nvmlGpmSampleGet {get_ms:.3f} ms, nvmlGpmMetricsGet {metrics_ms:.3f} ms, "
              f"SM activity {request.metrics[0].value:.1f}% (status {request.metrics[0].nvmlReturn})")
    except pynvml.NVMLError as error:
        print(f"  GPM: supported but failed: {error}")
    finally:
        for sample in samples:
            pynvml.nvmlGpmSampleFree(sample)


def _check_mig(pynvml: Any, handle: Any) -> None:
    """MIG devices: their UUIDs and instance ids, and whether per-instance GPM (nvmlGpmMigSampleGet) answers."""
    try:
        if pynvml.nvmlDeviceGetMigMode(handle)[0] != 1:
            return
        slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except pynvml.NVMLError:
        return
    for slot in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError:
            continue
        gi = _call(pynvml.nvmlDeviceGetGpuInstanceId, mig)
        line = (f"  MIG {slot}: {_call(pynvml.nvmlDeviceGetUUID, mig)} gi={gi} "
                f"ci={_call(pynvml.nvmlDeviceGetComputeInstanceId, mig)}; utilization "
                f"{_latency(lambda m=mig: pynvml.nvmlDeviceGetUtilizationRates(m), 1)}")
        sample = pynvml.nvmlGpmSampleAlloc()
        try:
            latency = _latency(lambda g=gi, s=sample: pynvml.nvmlGpmMigSampleGet(handle, g, s), 3)
            line += f"; nvmlGpmMigSampleGet {latency}"
        finally:
            pynvml.nvmlGpmSampleFree(sample)
        print(line)


def _check_order(pynvml: Any, count: int, cuda: Callable[[], list[str] | None]) -> None:
    from rnnmon.gpu.devices import resolve_uuid
    from rnnmon.gpu.nvml import Nvml

    nvml = Nvml()
    nvml.start()
    try:
        from rnnmon.gpu.devices import nvml_inventory

        inventory = nvml_inventory(nvml)
    finally:
        nvml.shutdown()
    uuids = cuda()
    if uuids is None:
        print("\nCUDA order: the CUDA driver library could not be asked (libcuda.so.1 missing?)")
        return
    print("\nCUDA ordinal -> NVML device (through the UUID):")
    differs = False
    for ordinal, uuid in enumerate(uuids):
        target = resolve_uuid(uuid, inventory)
        where = "no NVML device" if target is None else (
            f"NVML {target.index}" + (f" MIG gi={target.mig.gpu_instance_id}" if target.mig else ""))
        differs |= target is None or target.index != ordinal
        print(f"  CUDA {ordinal}  {uuid}  {where}")
    print("  CUDA order " + ("DIFFERS from NVML order: integer indices would watch the wrong GPU" if differs
                             else "matches NVML order here"))


def _cuda_uuids() -> list[str] | None:
    from rnnmon.gpu.cuda_devices import cuda_device_uuids

    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)  # this script may load the driver; rnnmon never does
    except OSError:
        return None
    return cuda_device_uuids()


def _latency(call: Callable[[], Any], repeats: int) -> str:
    durations = []
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        try:
            call()
        except Exception as error:
            return f"fails: {type(error).__name__}: {error}"
        durations.append(time.perf_counter() - started)
    return f"{statistics.median(durations) * 1e3:8.3f} ms (max {max(durations) * 1e3:.3f} ms)"


def _call(function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except Exception as error:
        return f"<{type(error).__name__}: {error}>"


# --- the fit ---------------------------------------------------------------------------------------------------

def _check_fit(periods: dict[int, float | None]) -> bool:
    import keras
    import numpy as np

    import rnnmon
    from rnnmon.analysis.summary import summarize
    from rnnmon.format.reader import open_logdir, read_runs

    backend = keras.backend.backend()
    print(f"\nFit: LSTM(256) on the {backend} backend, 120 steps, a {STALL_S:.0f} s input stall at step 60")
    stall: list[float] = []

    def batches():
        rng = np.random.default_rng(0)
        x = rng.normal(size=(256, 64, 32)).astype("float32")
        y = x[:, :, :1].mean(axis=1)
        step = 0
        while True:
            if step == 60:
                stall.append(time.time())
                time.sleep(STALL_S)
                stall.append(time.time())
            step += 1
            yield x, y

    logdir = tempfile.mkdtemp(prefix="gpu_check_")
    model = keras.Sequential([keras.Input((64, 32)), keras.layers.LSTM(256), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(batches(), steps_per_epoch=120, epochs=1, verbose=0, callbacks=[rnnmon.UtilizationMonitor(logdir)])
    provider, ctx = open_logdir(logdir)
    run = read_runs(provider, ctx)["rnnmon"]
    summary = summarize(run)
    checks: list[tuple[str, bool, str]] = []
    if not run.util:
        print(f"  FAIL no utilization recorded (GPUs watched: {run.info.get('gpus')}); log dir {logdir}")
        return False
    index = sorted(run.util)[0]
    util = run.util[index]
    spacing = float(np.median(np.diff(util[:, 0]))) if len(util) > 1 else float("nan")
    period = periods.get(index)
    expected = period if period else spacing
    checks.append(("samples at the driver's rate", period is not None and abs(spacing - period) <= 0.2 * period,
                   f"{len(util)} samples, median spacing {spacing * 1e3:.0f} ms, driver period "
                   f"{(expected or 0) * 1e3:.0f} ms"))
    computing = util[(util[:, 0] < stall[0] - 0.5) | (util[:, 0] > stall[1] + 0.5)] if stall else util
    busy = float(computing[:, 1].mean()) if len(computing) else 0.0
    checks.append(("utilization above 0 during compute", busy > 0, f"mean {busy:.1f}% outside the stall"))
    cause = "host" if backend == "torch" else "input"  # torch: input wait is part of the host gap
    covering = [g for g in summary["idle_gaps"] if g["device"] == index and g["cause"] == cause
                and abs(g["start"] - stall[0]) <= TOLERANCE_S and abs(g["end"] - stall[1]) <= TOLERANCE_S]
    long_gaps = [g for g in summary["idle_gaps"] if g["duration_s"] >= 1.0]
    checks.append((f"one '{cause}' gap covers the stall within ±{TOLERANCE_S} s",
                   len(covering) == 1 and len(long_gaps) == 1,
                   f"stall {stall[1] - stall[0]:.2f} s; gaps ≥ 1 s: "
                   + ", ".join(f"{g['cause']} {g['start'] - stall[0]:+.2f}..{g['end'] - stall[1]:+.2f} s"
                               for g in long_gaps)))
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL'} {name}: {detail}")
    print(f"  GPU {index}: {summary['gpus'][0]['name']}; run written to {logdir}")
    return all(ok for _, ok, _ in checks)


if __name__ == "__main__":
    sys.exit(main())
