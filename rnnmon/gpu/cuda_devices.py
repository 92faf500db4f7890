"""CUDA's own list of the devices this process can use, as UUIDs, straight from the CUDA driver API.

CUDA numbers devices after applying `CUDA_VISIBLE_DEVICES` (indices, full or short UUIDs, MIG UUIDs) and
`CUDA_DEVICE_ORDER` (FASTEST_FIRST by default, not NVML's PCI order), so ordinal k of a framework is
`cuda_device_uuids()[k]`; `rnnmon.gpu.devices` maps that UUID to its NVML device, as nvitop does. The driver
is asked only when the framework has already loaded `libcuda.so.1`: rnnmon never initialises CUDA itself
(that would change what a later fork or `CUDA_VISIBLE_DEVICES` edit can do).

Example:
    >>> cuda_device_uuids()     # on a 2-GPU host with CUDA_VISIBLE_DEVICES=1 after TensorFlow started
    ['8932f937-d72c-4106-c12f-20bd9faed9f6']
    >>> cuda_device_uuids()     # without a loaded libcuda
    None
"""

from __future__ import annotations

import ctypes
import os

_CUDA_SUCCESS = 0


def cuda_device_uuids(library: str = "libcuda.so.1") -> list[str] | None:
    """UUIDs of CUDA devices 0, 1, ... in CUDA's order, without "GPU-"/"MIG-" prefix; None when unknown."""
    try:
        cuda = ctypes.CDLL(library, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
    except OSError:  # not loaded by the framework (or no driver): do not load it here
        return None
    try:
        if cuda.cuInit(0) != _CUDA_SUCCESS:
            return None
        count = ctypes.c_int()
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != _CUDA_SUCCESS:
            return None
        get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid  # _v2: MIG UUIDs
        uuids = []
        for ordinal in range(count.value):
            device = ctypes.c_int()
            raw = (ctypes.c_ubyte * 16)()
            if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != _CUDA_SUCCESS or \
                    get_uuid(raw, device) != _CUDA_SUCCESS:
                return None
            uuids.append(format_uuid(bytes(raw)))
        return uuids
    except (AttributeError, OSError):  # a driver without these entry points
        return None


def format_uuid(raw: bytes) -> str:
    """16 bytes as 8-4-4-4-12 hex groups, the form NVML prints after "GPU-" or "MIG-"."""
    text = raw.hex()
    return "-".join((text[:8], text[8:12], text[12:16], text[16:20], text[20:32]))
