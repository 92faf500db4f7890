"""Placement audit: a pure function of the GPU counts and the NVML process check the callback gathers."""

import pytest

from rnnmon.audit.placement import audit_placement


@pytest.mark.parametrize(("nvml", "framework", "on_gpu"), [(1, 0, None), (4, 0, False), (2, 0, True)])
def test_gpu_that_tensorflow_cannot_see(nvml, framework, on_gpu):
    [finding] = audit_placement(nvml, framework, on_gpu)

    assert (finding.code, finding.severity) == ("TF_NO_GPU", "critical")
    assert f"NVML sees {nvml} GPU(s) but TensorFlow sees 0" in finding.message
    assert 'pip install "tensorflow[and-cuda]"' in finding.advice
    assert "tf.config.list_physical_devices('GPU')" in finding.advice
    assert "CUDA_VISIBLE_DEVICES" in finding.advice


def test_process_missing_from_the_gpu():
    [finding] = audit_placement(nvml_gpu_count=1, framework_gpu_count=1, process_on_gpu=False)

    assert (finding.code, finding.severity) == ("PROCESS_NOT_ON_GPU", "warning")
    assert "TensorFlow sees 1 GPU(s)" in finding.message
    assert "set_log_device_placement" in finding.advice


@pytest.mark.parametrize(
    ("nvml", "framework", "on_gpu"),
    [(1, 1, True), (1, 1, None), (0, 0, None), (0, 0, False), (2, 2, True)],
    ids=["on-gpu", "unknown", "cpu-machine", "cpu-machine-no-process", "two-gpus"],
)
def test_consistent_placement_is_not_flagged(nvml, framework, on_gpu):
    assert audit_placement(nvml, framework, on_gpu) == []
