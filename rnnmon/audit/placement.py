"""Static check of device placement, from facts the callback gathers: the GPUs NVML sees, the GPUs the
active Keras backend sees, and whether NVML lists this process on the watched GPUs.

Judged on the backend that trains: a JAX or torch fit with a CPU-only TensorFlow installed for tf.data (as
Keras's own CUDA requirement files pair them) is not "training on the CPU".

Example:
    >>> [f.code for f in audit_placement(nvml_gpu_count=1, framework_gpu_count=0, process_on_gpu=None)]
    ['TF_NO_GPU']
    >>> [f.code for f in audit_placement(1, 0, None, backend="jax")]
    ['JAX_NO_GPU']
"""

from __future__ import annotations

from rnnmon.findings import Finding

_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
_CODES = {"tensorflow": "TF_NO_GPU", "jax": "JAX_NO_GPU", "torch": "TORCH_NO_GPU"}
_INSTALL = {
    "tensorflow": ('`pip install "tensorflow[and-cuda]"`, then check that `tf.config.list_physical_devices(\'GPU\')` '
                   "lists the GPU (TensorFlow logs why it skipped CUDA libraries at import)"),
    "jax": ('`pip install "jax[cuda12]"` (or the build matching your CUDA), then check that `jax.devices()` lists '
            "a CUDA device"),
    "torch": ("install a CUDA build of torch (the index URL for your CUDA version from pytorch.org), then check that "
              "`torch.cuda.is_available()` is True"),
}
_CAUSES = {
    "tensorflow": "`pip install tensorflow` on Linux without the [and-cuda] extra, CUDA/cuDNN libraries that do not "
                  "match this TensorFlow build",
    "jax": "a CPU-only jaxlib (`pip install jax` without the [cuda12] extra), a CUDA plugin that does not match the "
           "driver",
    "torch": "a CPU-only torch wheel, a CUDA build newer than the driver supports",
}


def audit_placement(nvml_gpu_count: int, framework_gpu_count: int, process_on_gpu: bool | None,
                    backend: str = "tensorflow") -> list[Finding]:
    """<BACKEND>_NO_GPU if the driver sees GPUs the Keras backend does not; PROCESS_NOT_ON_GPU if the backend
    sees a GPU but NVML lists no context of this process on it (`process_on_gpu=None`: unknown, no finding)."""
    name = _NAMES.get(backend, backend)
    if nvml_gpu_count >= 1 and framework_gpu_count == 0 and backend in _CODES:
        message = (
            f"NVML sees {nvml_gpu_count} GPU(s) but {name} sees 0: training on the {backend} backend runs on the CPU. "
            f"Typical causes: {_CAUSES[backend]}, or CUDA_VISIBLE_DEVICES hiding the GPUs."
        )
        advice = f"{_INSTALL[backend]}, and that CUDA_VISIBLE_DEVICES is unset or names the GPU."
        return [Finding.of(_CODES[backend], "placement", message, advice)]
    if framework_gpu_count >= 1 and process_on_gpu is False:
        message = (
            f"{name} sees {framework_gpu_count} GPU(s), but NVML's process list shows no context of this "
            "process on the GPUs the model uses: the model and its ops may all have been placed on the CPU."
        )
        advice = (
            "Look for `with tf.device('/CPU:0')` around model building or fit, a distribution strategy over "
            "CPU devices, or `tf.config.set_visible_devices([], 'GPU')`; "
            "`tf.debugging.set_log_device_placement(True)` shows where each op runs."
            if backend == "tensorflow" else
            "Look for a `jax.default_device(cpu)` / `keras.device('cpu')` scope or `CUDA_VISIBLE_DEVICES=''` in "
            "the job's environment."
        )
        return [Finding.of("PROCESS_NOT_ON_GPU", "placement", message, advice)]
    return []
