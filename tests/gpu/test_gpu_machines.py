"""The hard cases of real GPU machines, scripted in the fake NVML and driven through the real pynvml binding:
CUDA vs NVML numbering, MIG, cgroup-hidden GPUs, unprivileged process queries, sample buffers with a 1 s
period or that run dry, clock steps, odd values, GPM spacing, old drivers, PCIe counters, slow and hung calls.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import numpy as np
import pynvml
import pytest
from conftest import read_run, stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeMig, FakeNvmlLib, ManualClock, bare_uuid, installed

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize
from rnnmon.audit.placement import audit_placement
from rnnmon.format import schema
from rnnmon.gpu.devices import process_on_devices, select_devices
from rnnmon.gpu.nvml import Nvml
from rnnmon.gpu.sampler import Sampler
from rnnmon.report import render_text

with contextlib.suppress(ImportError):
    from rnnmon.gpu.devices import GpuTarget

T0 = 1_700_000_000.0
_STAT = {name: i for i, name in enumerate(schema.STAT_COLUMNS)}


@contextlib.contextmanager
def session(lib: FakeNvmlLib, deadline_s: float | None = None) -> Iterator[Nvml]:
    with installed(lib):
        nvml = Nvml() if deadline_s is None else Nvml(deadline_s=deadline_s)
        assert nvml.start()
        try:
            yield nvml
        finally:
            nvml.shutdown()


def poll_for(sampler: Sampler, clock: ManualClock, seconds: float, every_s: float = 0.5) -> None:
    for _ in range(round(seconds / every_s)):
        clock.advance(every_s)
        sampler.poll()


def no_cuda() -> None:
    return None


# --- which devices ----------------------------------------------------------------------------------------

def test_cuda_ordinals_map_to_nvml_through_uuids_not_indices():
    # FASTEST_FIRST: CUDA's device 0 is NVML's GPU 2. TensorFlow maps memory on every GPU, so the
    # process is listed on all four; only the model's device is watched.
    gpus = [FakeGpu(name="NVIDIA T4", pids=[os.getpid()]) for _ in range(3)] + [FakeGpu(pids=[os.getpid()])]
    lib = FakeNvmlLib(gpus)
    cuda_order = [bare_uuid(gpus[i].uuid) for i in (2, 0, 1, 3)]
    with session(lib) as nvml:
        assert select_devices(nvml, "auto", {}, model_ordinals=[0], cuda=lambda: cuda_order) == \
            [GpuTarget(2, gpus[2].uuid)]
        assert [t.index for t in select_devices(nvml, "auto", {}, model_ordinals=[1, 3],
                                                cuda=lambda: cuda_order)] == [0, 3]
        # without a model device the GPUs listing the process remain the fallback
        assert [t.index for t in select_devices(nvml, "auto", {}, cuda=no_cuda)] == [0, 1, 2, 3]


def test_cuda_visible_devices_forms_mig_and_hidden_gpus():
    migs = [FakeMig(gpu_instance_id=3, compute_instance_id=0), FakeMig(gpu_instance_id=5, compute_instance_id=0)]
    gpus = [FakeGpu(no_permission=True), FakeGpu(), FakeGpu(pids=[os.getpid()]), FakeGpu(mig=migs)]
    with session(FakeNvmlLib(gpus)) as nvml:
        def auto(spec: str, model_ordinals: list[int] | None = None) -> list[GpuTarget]:
            return select_devices(nvml, "auto", {"CUDA_VISIBLE_DEVICES": spec}, model_ordinals=model_ordinals,
                                  cuda=no_cuda)

        assert [t.index for t in select_devices(nvml, "all")] == [1, 2, 3]  # GPU 0 answers NO_PERMISSION
        assert [t.index for t in auto("0,1", [0, 1])] == [1, 2]  # CUDA counts only the GPUs the cgroup allows
        assert [t.index for t in auto("GPU-00000003")] == [3]  # a short UUID prefix, as CUDA allows
        assert auto("GPU-0000000") == []  # ambiguous prefix: CUDA stops there
        [mig] = auto(migs[1].uuid)
        assert (mig.index, mig.uuid, mig.mig.gpu_instance_id) == (3, migs[1].uuid, 5)  # not GPU 1 (index in parent)
        assert auto(f"MIG-{gpus[3].uuid}/5/0") == [mig]  # the R450 form MIG-GPU-<uuid>/<gi>/<ci>
        assert auto(f"MIG-{gpus[3].uuid[:12]}/3/0")[0].mig.gpu_instance_id == 3
        # CUDA's own list (driver API) names the MIG device by its bare UUID
        assert select_devices(nvml, "auto", {}, model_ordinals=[0], cuda=lambda: [bare_uuid(migs[0].uuid)]) == \
            [GpuTarget(3, migs[0].uuid, mig=auto(migs[0].uuid)[0].mig)]


def test_failed_process_query_is_unknown_not_absent():
    gpus = [FakeGpu(process_query_error=pynvml.NVML_ERROR_NO_PERMISSION), FakeGpu(), FakeGpu(pids=[4242])]
    with session(FakeNvmlLib(gpus)) as nvml:
        targets = select_devices(nvml, "all")
        assert process_on_devices(nvml, targets[:1]) is None  # NO_PERMISSION without root: unknown
        assert process_on_devices(nvml, targets[:2]) is None
        assert process_on_devices(nvml, targets[1:2]) is False  # the query worked and lists nobody
        assert process_on_devices(nvml, targets[2:]) is None  # another pid namespace, perhaps


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_no_gpu_finding_names_the_keras_backend(backend):
    assert audit_placement(2, 1, True, backend=backend) == []  # tensorflow-cpu beside it is not the question
    [finding] = audit_placement(2, 0, None, backend=backend)
    assert finding.code == {"jax": "JAX_NO_GPU", "torch": "TORCH_NO_GPU"}[backend]
    assert "TensorFlow" not in finding.message and "tensorflow[and-cuda]" not in finding.advice


def test_backend_gpu_count_asks_the_active_backend():
    import tensorflow  # noqa: F401  (imported: the old check would judge JAX fits on it)

    from rnnmon.gpu.devices import backend_gpu_count, model_cuda_ordinals

    pytest.importorskip("jax")
    assert backend_gpu_count("jax") == 0 and backend_gpu_count("tensorflow") == 0
    assert model_cuda_ordinals(tiny_model(), "tensorflow") is None  # variables on /device:CPU:0


# --- MIG: no utilization ----------------------------------------------------------------------------------

def test_mig_instance_uses_per_instance_gpm_in_place_of_utilization():
    mig = FakeMig(gpu_instance_id=2, sm_util_pct=lambda t: 60.0, memory_total_mib=20000)
    clock = ManualClock(T0)
    lib = FakeNvmlLib([FakeGpu(), FakeGpu(mig=[mig], sm_util_pct=99.0)], clock=clock)
    with session(lib) as nvml:
        [target] = select_devices(nvml, "auto", {"CUDA_VISIBLE_DEVICES": mig.uuid}, cuda=no_cuda)
        sampler = Sampler(nvml, [target], clock=clock)
        poll_for(sampler, clock, 3.0)
        util, stats, _ = sampler.drain()
        [described] = sampler.describe()
        sampler.close()
    assert described["index"] == 1 and described["utilization"] == "gpm" and described["mig"]["gpu_instance_id"] == 2
    assert len(util[1]) >= 4 and {pct for _, pct in util[1]} == {60.0}  # the instance's, not the GPU's 99
    rows = np.asarray(stats[1])
    assert set(rows[:, _STAT["memory_total_mib"]]) == {20000.0}  # memory of the instance
    assert lib.calls["nvmlGpmMigSampleGet"] >= 4 and lib.calls["nvmlDeviceGetSamples"] == 0
    assert lib.gpm_samples_allocated == 0


@pytest.mark.slow
def test_mig_without_gpm_reports_no_utilization_and_keeps_step_gaps(tmp_path, monkeypatch):
    mig = FakeMig()
    lib = FakeNvmlLib([FakeGpu(), FakeGpu(mig=[mig], gpm_supported=False, pids=[os.getpid()])])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig.uuid)  # read by rnnmon only; TensorFlow started long ago
    with installed(lib):
        tiny_model().fit(stalled_dataset(40, lambda i: 0.3 if i == 20 else 0.002), epochs=1, verbose=0,
                         callbacks=[UtilizationMonitor(str(tmp_path), audit=False)])
    run = read_run(str(tmp_path))
    summary = summarize(run)
    [gpu] = summary["gpus"]
    assert gpu["index"] == 1 and gpu["utilization"] == "not reported on MIG" and gpu["util_mean"] is None
    assert any(g["device"] is None and g["cause"] == "input" and g["duration_s"] >= 0.25
               for g in summary["idle_gaps"])  # step phases still find the stall
    text = render_text({"runs": [summary], "comparison": None})
    assert "utilization not reported on MIG" in text and "CPU-only" not in text
    from rnnmon_tensorboard.timeline import build_timeline

    [tab_gpu] = build_timeline(run, None, None, 200)["gpus"]  # the tab lists it too, as such
    assert tab_gpu["utilization"] == "not reported on MIG" and tab_gpu["util"]["total"] == 0


# --- the sample buffer ------------------------------------------------------------------------------------

def utilization_rows(sampler: Sampler) -> np.ndarray:
    util, _, _ = sampler.drain()
    return np.asarray(next(iter(util.values())), dtype=float).reshape(-1, 2)


def test_transient_sample_error_keeps_the_buffer(rnnmon_warnings):
    clock = ManualClock(T0)
    lib = FakeNvmlLib([FakeGpu(utilization=50.0)], clock=clock)
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"), clock=clock)
        poll_for(sampler, clock, 2.0)
        lib.failing["nvmlDeviceGetSamples"] = pynvml.NVML_ERROR_UNKNOWN
        poll_for(sampler, clock, 1.0)
        del lib.failing["nvmlDeviceGetSamples"]
        sampler.drain()
        poll_for(sampler, clock, 3.0)
        rows = utilization_rows(sampler)
    assert len(rows) >= 17  # every 1/6 s sample again, not one reading per poll
    assert np.median(np.diff(rows[:, 0])) == pytest.approx(1 / 6, abs=0.01)
    assert len(rnnmon_warnings()) == 1


def test_one_second_period_adds_no_stale_copies():
    clock = ManualClock(T0 + 0.25)
    lib = FakeNvmlLib([FakeGpu(utilization=lambda t: 10.0 + (t - T0) % 80)], clock=clock, sample_period_s=1.0)
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"), clock=clock)
        poll_for(sampler, clock, 10.0)
        rows = utilization_rows(sampler)
    assert 9 <= len(rows) <= 11  # the driver's ten samples, no reading stamped "now" between them
    assert np.diff(rows[:, 0]).min() == pytest.approx(1.0, abs=0.01)


def test_buffer_that_runs_dry_while_idle_falls_back_to_readings():
    clock = ManualClock(T0)
    lib = FakeNvmlLib([FakeGpu(utilization=lambda t: 0.0 if T0 + 3 <= t < T0 + 6 else 80.0)], clock=clock,
                      sample_period_s=1 / 6, dry_below_pct=5.0)
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"), clock=clock)
        poll_for(sampler, clock, 9.0)
        rows = utilization_rows(sampler)
    idle = rows[rows[:, 1] == 0.0]
    assert len(idle) >= 5 and idle[0, 0] - T0 <= 3.5 + 2 / 6 + 0.01 and idle[-1, 0] - T0 <= 6.5  # readings


def test_clock_step_back_recalibrates_and_resets_last_seen():
    clock = ManualClock(T0)
    lib = FakeNvmlLib([FakeGpu(utilization=lambda t: 10.0 * ((t - T0) % 10))], clock=clock)
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"), clock=clock)
        poll_for(sampler, clock, 4.0)
        lib.step_clock(-2.0)  # NTP steps the clock the NVML stamps come from
        poll_for(sampler, clock, 5.0)
        rows = utilization_rows(sampler)
    after = rows[rows[:, 0] > T0 + 5.0]
    assert len(after) >= 15  # samples keep coming after the step
    placed_s = after[:, 0] - T0
    assert np.abs(after[:, 1] / 10.0 - placed_s).max() < 0.4  # each where it happened, not 2 s early


def test_values_outside_0_to_100_are_dropped_with_one_warning(rnnmon_warnings):
    clock = ManualClock(T0)
    lib = FakeNvmlLib([FakeGpu(utilization=lambda t: 255.0 if (t - T0) % 1 < 0.3 else 40.0)], clock=clock)
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"), clock=clock)
        poll_for(sampler, clock, 3.0)
        rows = utilization_rows(sampler)
    assert len(rows) >= 10 and set(rows[:, 1]) == {40.0}
    [warning] = rnnmon_warnings()
    assert "outside 0-100" in warning


# --- GPM, old drivers, PCIe -------------------------------------------------------------------------------

def test_gpm_samples_are_at_least_100ms_apart():
    clock = ManualClock(T0)
    lib = FakeNvmlLib([FakeGpu()], clock=clock)
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"), clock=clock)
        poll_for(sampler, clock, 2.0, every_s=0.05)
        _, stats, _ = sampler.drain()
        sampler.close()
    assert lib.calls["nvmlGpmSampleGet"] <= 2.0 / 0.1 + 1
    activity = np.asarray(stats[0])[:, _STAT["sm_activity_pct"]]
    assert np.nanmean(activity) == pytest.approx(80.0) and lib.gpm_samples_allocated == 0


def test_gpm_samples_are_freed_when_monitoring_cannot_start(tmp_path, traced_model):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    lib = FakeNvmlLib([FakeGpu()])
    with installed(lib):
        traced_model.fit(stalled_dataset(4), epochs=1, verbose=0,
                         callbacks=[UtilizationMonitor(str(not_a_directory), audit=False)])
    assert lib.calls["nvmlGpmSampleAlloc"] == 2 and lib.gpm_samples_allocated == 0


def test_old_driver_falls_back_to_throttle_reasons(rnnmon_warnings):
    clock = ManualClock(T0)
    lib = FakeNvmlLib([FakeGpu(clocks_event_reasons=0x4)], clock=clock, driver_version="470.82.01",
                      missing={"nvmlDeviceGetCurrentClocksEventReasons"})
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"), clock=clock)
        poll_for(sampler, clock, 1.0)
        _, stats, _ = sampler.drain()
    assert set(np.asarray(stats[0])[:, _STAT["clocks_event_reasons"]]) == {4.0}
    assert rnnmon_warnings() == []


def bursts(t: float) -> float:
    """Cumulative bytes of 10 ms bursts at 1 GiB/s starting 0.1 s into every 0.25 s."""
    period, start, length, rate = 0.25, 0.1, 0.01, 2.0**30
    k, phase = divmod(t - T0, period)
    return (k * length + min(max(phase - start, 0.0), length)) * rate


def test_pcie_counters_see_the_bursts_a_20ms_snapshot_misses():
    clock = ManualClock(T0)
    lib = FakeNvmlLib([FakeGpu(pcie_rx_total_bytes=bursts, pcie_tx_total_bytes=bursts)], clock=clock)
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"), clock=clock)
        poll_for(sampler, clock, 5.0)
        _, stats, _ = sampler.drain()
    rx = np.asarray(stats[0])[:, _STAT["pcie_rx_mib_s"]]
    assert np.nanmean(rx) == pytest.approx(1024 * 0.01 / 0.25, rel=0.02)  # 40.96 MiB/s on average
    assert lib.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_slow_pcie_and_gpm_calls_keep_a_poll_short():
    lib = FakeNvmlLib([FakeGpu()], latency_s={"nvmlDeviceGetPcieThroughput": 0.02, "nvmlGpmSampleGet": 0.003,
                                               "nvmlGpmMetricsGet": 0.003})
    with session(lib) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"))
        for _ in range(6):
            sampler.poll()
            time.sleep(0.11)  # GPM is sampled at most every 100 ms
        sampler.close()
    # The time a poll spends in the slow calls, from the calls it made: GPM's two, not PCIe's snapshots
    # (two 20 ms snapshots alone would be 40 ms).
    driver_s = sum(lib.started[name] * seconds for name, seconds in lib.latency_s.items()) / 6
    assert lib.started["nvmlGpmSampleGet"] >= 6 and driver_s < 0.03, (lib.started, driver_s)


def test_hung_call_is_abandoned_with_one_warning_and_polling_goes_on(rnnmon_warnings):
    lib = FakeNvmlLib([FakeGpu()], latency_s={"nvmlDeviceGetPowerUsage": 10.0})
    with session(lib, deadline_s=0.2) as nvml:
        sampler = Sampler(nvml, select_devices(nvml, "all"))
        for _ in range(4):
            sampler.poll()
        _, stats, _ = sampler.drain()
    rows = np.asarray(stats[0])
    assert len(rows) == 4 and lib.started["nvmlDeviceGetPowerUsage"] == 1  # one deadline, then no longer asked
    assert np.isnan(rows[:, _STAT["power_w"]]).all() and not np.isnan(rows[:, _STAT["temperature_c"]]).any()
    [warning] = rnnmon_warnings()
    assert "power did not answer within 0.2 s" in warning
