"""Real fits with the real pynvml binding driven by a scripted fake NVML library."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from conftest import read_run, stalled_dataset, tiny_model
from fake_nvml import FakeGpu, FakeNvmlLib, installed
from idle_windows import IdleWindows, MarkEvaluation

from rnnmon import UtilizationMonitor
from rnnmon.analysis.summary import summarize
from rnnmon.format import schema


def _stall_at(index: int, seconds: float, windows: IdleWindows):
    def delay(batch: int) -> float:
        if batch != index:
            return 0.003
        windows.open()
        time.sleep(seconds)
        windows.close()
        return 0.0

    return delay


@pytest.mark.slow
def test_idle_dip_becomes_a_gap_with_the_right_cause(tmp_path):
    windows = IdleWindows()
    lib = FakeNvmlLib([FakeGpu(utilization=windows.utilization, pids=[os.getpid()])])
    with installed(lib):
        model = tiny_model()
        model.fit(stalled_dataset(60, _stall_at(30, 1.2, windows), prefetch="none"),
                  validation_data=stalled_dataset(60, 0.03).take(40), epochs=1,  # outlasts its warm-up batch
                  verbose=0, callbacks=[UtilizationMonitor(str(tmp_path)), MarkEvaluation(windows)])
    summary = summarize(read_run(str(tmp_path)))
    (stall_start, stall_end), (eval_start, eval_end) = windows.windows
    gaps = summary["idle_gaps"]
    input_gaps = [g for g in gaps if g["cause"] == "input"]
    assert len(input_gaps) == 1, gaps
    assert input_gaps[0]["device"] == 0
    assert abs(input_gaps[0]["start"] - stall_start) < 0.35 and abs(input_gaps[0]["end"] - stall_end) < 0.35
    eval_gaps = [g for g in gaps if g["cause"] == "eval"]
    assert eval_gaps and eval_gaps[0]["start"] >= eval_start - 0.35 and eval_gaps[-1]["end"] <= eval_end + 0.35
    gpu = summary["gpus"][0]
    assert gpu["name"] == "NVIDIA H200" and gpu["samples"] > 10 and 0 < gpu["idle_fraction"] < 1
    assert gpu["power_mean_w"] == pytest.approx(350.0) and gpu["sm_activity_mean"] == pytest.approx(80.0)


@pytest.mark.slow
def test_samples_keep_driver_resolution_and_calibrate_onto_host_time(tmp_path):
    lib = FakeNvmlLib([FakeGpu(utilization=lambda t: 50.0 + 40.0 * (int(t * 6) % 2))])
    with installed(lib):
        model = tiny_model()
        before = time.time()
        model.fit(stalled_dataset(80, 0.02), epochs=1, verbose=0, callbacks=[UtilizationMonitor(str(tmp_path))])
        after = time.time()
    util = read_run(str(tmp_path)).util[0]
    spacing = np.diff(util[:, 0])
    assert np.median(spacing) == pytest.approx(1 / 6, abs=0.01)  # every driver sample, none lost
    assert before - 0.5 < util[0, 0] and util[-1, 0] < after + 0.5  # opaque timestamps mapped to wall time
    assert set(np.unique(util[:, 1])) <= {50.0, 90.0}


FAILURES = {
    "not_supported": (dict(unsupported={"nvmlDeviceGetPowerUsage"}), "power"),
    "function_not_found": (dict(missing={"nvmlDeviceGetFieldValues", "nvmlDeviceGetPcieThroughput"}),
                           "PCIe throughput"),
    "gpu_lost": (dict(lost_after="soon"), "lost"),
}


@pytest.mark.slow
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_nvml_failures_leave_na_and_one_warning(tmp_path, failure, rnnmon_warnings):
    options, words = FAILURES[failure]
    if options.get("lost_after") == "soon":
        options = dict(lost_after=time.time() + 1.5)
    lib = FakeNvmlLib([FakeGpu()], **options)
    with installed(lib):
        history = tiny_model().fit(stalled_dataset(100, 0.02), epochs=1, verbose=0,
                                   callbacks=[UtilizationMonitor(str(tmp_path), sample_interval_s=0.1, audit=False)])
    assert len(history.history["loss"]) == 1
    warnings = rnnmon_warnings()
    assert len(warnings) == 1 and words in warnings[0], warnings
    run = read_run(str(tmp_path))
    stats = run.stats[0]
    column = {"not_supported": "power_w", "function_not_found": "pcie_rx_mib_s"}.get(failure)
    if column:
        assert np.isnan(stats[:, schema.STAT_COLUMNS.index(column)]).all()
        assert not np.isnan(stats[:, schema.STAT_COLUMNS.index("temperature_c")]).any()
    else:
        assert run.util[0][-1, 0] < options["lost_after"] + 0.2  # nothing sampled after the loss
        assert len(run.steps) == 100


def test_missing_library_means_cpu_only_mode(tmp_path, rnnmon_warnings, no_nvml, traced_model):
    traced_model.fit(stalled_dataset(30, 0.02), epochs=1, verbose=0,
                     callbacks=[UtilizationMonitor(str(tmp_path), audit=False)])
    warnings = rnnmon_warnings()  # CPU-only mode is announced once per process: here, or by an earlier test
    assert len(warnings) <= 1 and all("CPU-only" in w for w in warnings), warnings
    run = read_run(str(tmp_path))
    assert run.info["nvml"] == "unavailable"
    summary = summarize(run)
    assert summary["gpus"] == [] and summary["steps"] == 30
    assert all(g["device"] is None for g in summary["idle_gaps"])


def test_device_selection_follows_cuda_visible_devices_and_process_list():
    from rnnmon.gpu.devices import select_devices
    from rnnmon.gpu.nvml import Nvml

    gpus = [FakeGpu(), FakeGpu(pids=[os.getpid()]), FakeGpu(), FakeGpu(pids=[os.getpid()])]
    with installed(FakeNvmlLib(gpus)):
        nvml = Nvml()
        assert nvml.start()

        def indices(choice, environ=None):
            return [t.index for t in select_devices(nvml, choice, environ, cuda=lambda: None)]

        assert indices("all") == [0, 1, 2, 3]
        assert indices([2]) == [2]
        assert indices("auto", {}) == [1, 3]  # no GPU seen by the backend: where this process runs
        assert indices("auto", {"CUDA_VISIBLE_DEVICES": "2,0"}) == [2, 0]
        uuid = gpus[3].uuid
        assert indices("auto", {"CUDA_VISIBLE_DEVICES": f"{uuid},bogus,1"}) == [3]
        with pytest.raises(ValueError, match="no GPU with NVML index"):
            select_devices(nvml, [7])
        nvml.shutdown()


@pytest.mark.slow
def test_without_the_sample_buffer_utilization_falls_back_to_readings(tmp_path, rnnmon_warnings):
    lib = FakeNvmlLib([FakeGpu(utilization=42.0)], missing={"nvmlDeviceGetSamples"})
    with installed(lib):
        tiny_model().fit(stalled_dataset(60, 0.02), epochs=1, verbose=0,
                         callbacks=[UtilizationMonitor(str(tmp_path), sample_interval_s=0.2, audit=False)])
    warnings = rnnmon_warnings()
    assert len(warnings) == 1 and "utilization samples" in warnings[0]
    util = read_run(str(tmp_path)).util[0]
    assert len(util) >= 5 and set(util[:, 1]) == {42.0}
    assert np.median(np.diff(util[:, 0])) == pytest.approx(0.2, abs=0.05)  # one reading per poll
    assert lib.calls["nvmlDeviceGetUtilizationRates"] >= len(util)


def test_a_poll_under_way_when_nvml_shuts_down_reads_na_and_raises_nothing():
    """The end of fit shuts NVML down while a hung sampler thread is still in a poll (CI saw it raise
    AttributeError from the constants it looks up between calls)."""
    from rnnmon.format.schema import STAT_COLUMNS
    from rnnmon.gpu.nvml import Nvml
    from rnnmon.gpu.sampler import Sampler

    with installed(FakeNvmlLib([FakeGpu()])):
        nvml = Nvml()
        assert nvml.start()
        sampler = Sampler(nvml, [0])
        sampler.poll()
        nvml.shutdown()
        sampler.poll()
    _, stats, _ = sampler.drain()
    first, last = stats[0]
    power = STAT_COLUMNS.index("power_w")
    assert not np.isnan(first[power]) and np.isnan(last[power])


def test_a_call_that_nvml_shutdown_overtakes_warns_of_nothing(rnnmon_warnings):
    """A slow driver call still running when the end of fit shuts NVML down answers UNINITIALIZED: no fault of
    the device, so no warning (it used to say "power is unavailable on GPU 0", and keep quiet about a real fault
    of that metric in the next KerasTuner trial)."""
    import threading

    from rnnmon.gpu.nvml import Nvml
    from rnnmon.gpu.sampler import Sampler

    lib = FakeNvmlLib([FakeGpu()])
    with installed(lib):
        nvml = Nvml()
        assert nvml.start()
        sampler = Sampler(nvml, [0])
        lib.latency_s["nvmlDeviceGetPowerUsage"] = 0.3  # under the 2 s deadline: slow, not hung
        poll = threading.Thread(target=sampler.poll)
        poll.start()
        time.sleep(0.1)
        nvml.shutdown()
        poll.join()
    assert len(sampler.drain()[1][0]) == 1 and rnnmon_warnings() == []
