"""benchmarks/gpu_check.py against the fake NVML (driver facts only), and its message on a machine without one."""

from __future__ import annotations

import importlib.util
import os

from conftest import ROOT
from fake_nvml import FakeGpu, FakeMig, FakeNvmlLib, bare_uuid, installed

_PATH = os.path.join(ROOT, "benchmarks", "gpu_check.py")


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prints_what_the_driver_does(capsys):
    lib = FakeNvmlLib([FakeGpu(name="NVIDIA A10"), FakeGpu(mig=[FakeMig(gpu_instance_id=4)])], sample_period_s=1 / 6)
    cuda_order = [bare_uuid(lib.gpus[1].uuid), bare_uuid(lib.gpus[0].uuid)]
    with installed(lib):
        status = gpu_check().main(["--skip-fit", "--repeats", "2", "--wait-s", "0.2"], cuda=lambda: cuda_order)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "period 166.7 ms" in out and "newest timestamp minus time.time()" in out and "CLOCK_MONOTONIC" in out
    for call in ("nvmlDeviceGetSamples", "nvmlDeviceGetFieldValues", "nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetComputeRunningProcesses", "nvmlGpmQueryDeviceSupport"):
        assert call in out
    assert "GPM: supported; nvmlGpmSampleGet" in out and lib.gpm_samples_allocated == 0
    assert "MIG 0: MIG-" in out and "gi=4" in out and "nvmlGpmMigSampleGet" in out
    assert "CUDA 0" in out and "NVML 1" in out and "DIFFERS from NVML order" in out


def test_without_a_gpu_it_says_so_and_exits_2(capsys, no_nvml):
    assert gpu_check().main(["--skip-fit"]) == 2
    assert "no NVIDIA GPU here" in capsys.readouterr().out
