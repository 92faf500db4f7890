"""Static check of device placement, from facts the callback gathers (NVML and framework GPU counts).

Example:
    >>> [f.code for f in audit_placement(nvml_gpu_count=1, framework_gpu_count=0, process_on_gpu=None)]
    ['TF_NO_GPU']
"""

from __future__ import annotations

from rnnmon.findings import Finding


def audit_placement(
    nvml_gpu_count: int, framework_gpu_count: int, process_on_gpu: bool | None
) -> list[Finding]:
    """TF_NO_GPU if the driver sees GPUs TensorFlow does not; PROCESS_NOT_ON_GPU if TensorFlow sees a GPU
    but NVML lists no context of this process on it (`process_on_gpu=None`: unknown, no finding)."""
    if nvml_gpu_count >= 1 and framework_gpu_count == 0:
        message = (
            f"NVML sees {nvml_gpu_count} GPU(s) but TensorFlow sees 0: training runs on the CPU. Typical "
            "causes: `pip install tensorflow` on Linux without the [and-cuda] extra, CUDA/cuDNN libraries "
            "that do not match this TensorFlow build, or CUDA_VISIBLE_DEVICES hiding the GPUs."
        )
        advice = (
            '`pip install "tensorflow[and-cuda]"`, then check that '
            "`tf.config.list_physical_devices('GPU')` lists the GPU (TensorFlow logs why it skipped CUDA "
            "libraries at import) and that CUDA_VISIBLE_DEVICES is unset or names the GPU."
        )
        return [Finding("TF_NO_GPU", "critical", "placement", message, advice)]
    if framework_gpu_count >= 1 and process_on_gpu is False:
        message = (
            f"TensorFlow sees {framework_gpu_count} GPU(s), but NVML's process list shows no context of this "
            "process on any GPU: the model and its ops may all have been placed on the CPU."
        )
        advice = (
            "Look for `with tf.device('/CPU:0')` around model building or fit, a distribution strategy over "
            "CPU devices, or `tf.config.set_visible_devices([], 'GPU')`; "
            "`tf.debugging.set_log_device_placement(True)` shows where each op runs."
        )
        return [Finding("PROCESS_NOT_ON_GPU", "warning", "placement", message, advice)]
    return []
