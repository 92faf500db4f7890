"""Which GPUs this process uses, as NVML device indices.

Order of evidence: `CUDA_VISIBLE_DEVICES` (indices or UUIDs), then the framework's visible devices (only if
TensorFlow is already imported), then NVML's list of processes per device.

Example:
    >>> nvml = Nvml(); nvml.start()
    >>> select_devices(nvml, "auto")   # e.g. [0] on a one-GPU machine, [] without NVML
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Literal

from rnnmon.nvml import Nvml

DeviceChoice = Literal["auto", "all"] | Sequence[int]


def select_devices(nvml: Nvml, choice: DeviceChoice = "auto", environ: dict[str, str] | None = None) -> list[int]:
    """NVML indices to sample: all of them, an explicit list, or ("auto") the ones this process uses."""
    if not nvml.available:
        return []
    count = nvml.query("nvmlDeviceGetCount", label="device count") or 0
    every = list(range(count))
    if choice == "all":
        return every
    if not isinstance(choice, str):
        unknown = [i for i in choice if i not in every]
        if unknown:
            raise ValueError(f"rnnmon: no GPU with NVML index {unknown}; this machine has {count}. "
                             f"Received: devices={list(choice)!r}")
        return list(choice)
    visible = _cuda_visible(nvml, every, os.environ if environ is None else environ)
    visible = _framework_visible(visible)
    used = [i for i in visible if os.getpid() in _pids_on(nvml, i)]
    return used or visible


def _cuda_visible(nvml: Nvml, every: list[int], environ: dict[str, str] | os._Environ[str]) -> list[int]:
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return every
    chosen: list[int] = []
    for item in (part.strip() for part in spec.split(",")):
        if item.isdigit():
            index = int(item)
        elif item.startswith(("GPU-", "MIG-")):
            index = _index_of_uuid(nvml, item)
        else:
            index = None
        if index is None or index not in every:
            break  # CUDA ignores everything after the first invalid entry
        chosen.append(index)
    return chosen


def _index_of_uuid(nvml: Nvml, uuid: str) -> int | None:
    handle = nvml.query("nvmlDeviceGetHandleByUUID", uuid, label="device by UUID")
    return None if handle is None else nvml.query("nvmlDeviceGetIndex", handle, label="device index")


def _framework_visible(visible: list[int]) -> list[int]:
    """Keep the CUDA-visible devices TensorFlow still shows (`tf.config.set_visible_devices`)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return visible
    try:
        shown = tf.config.get_visible_devices("GPU")
    except Exception:  # a framework quirk must not stop monitoring
        return visible
    if not shown:  # a CPU-only TensorFlow build: keep watching, the audit explains TF_NO_GPU
        return visible
    ordinals = sorted(int(device.name.rsplit(":", 1)[-1]) for device in shown)
    return [visible[k] for k in ordinals if k < len(visible)]


def _pids_on(nvml: Nvml, index: int) -> set[int]:
    handle = nvml.query("nvmlDeviceGetHandleByIndex", index, label="device handle", device=index)
    if handle is None:
        return set()
    processes = nvml.query("nvmlDeviceGetComputeRunningProcesses", handle, label="process list",
                           device=index) or []
    return {process.pid for process in processes}


def framework_gpu_count() -> int | None:
    """GPUs TensorFlow can see, or None when TensorFlow is not imported."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    try:
        return len(tf.config.get_visible_devices("GPU"))
    except Exception:
        return None


def process_on_devices(nvml: Nvml, indices: list[int]) -> bool | None:
    """True if NVML lists this process on one of `indices`; False only if those GPUs list no process at all.

    Inside a container NVML reports host process ids, so "other processes but not ours" means unknown (None).
    """
    if not indices:
        return None
    listed = set().union(*(_pids_on(nvml, i) for i in indices))
    if os.getpid() in listed:
        return True
    return False if not listed else None
