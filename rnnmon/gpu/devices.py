"""Which GPUs to watch, as NVML devices: the ones the model computes on.

A framework's GPU k is CUDA's device k, and CUDA's numbering is not NVML's (CUDA_DEVICE_ORDER defaults to
FASTEST_FIRST, NVML counts in PCI order; cgroups hide devices NVML still counts; MIG devices have their own
UUIDs). So each CUDA ordinal is mapped to NVML through its UUID: CUDA's own list (`cuda_devices`) when the
framework has loaded the driver, else `CUDA_VISIBLE_DEVICES` read as CUDA reads it (indices, full or short
UUIDs, `MIG-<uuid>` and `MIG-GPU-<uuid>/<gi>/<ci>`). A MIG device is watched through its parent GPU for
the GPU-wide metrics and through its own handle (and GPU instance id) for what is per instance.

`devices="auto"` means the GPUs the model computes on: where its variables live (the distribution
strategy's devices on TensorFlow, the JAX or torch device otherwise). Only when the backend shows no GPU
does rnnmon fall back to the GPUs NVML lists this process on, else every visible GPU.

Example:
    >>> nvml = Nvml(); nvml.start()
    >>> select_devices(nvml, "auto", model_ordinals=model_cuda_ordinals(model))
    [GpuTarget(index=3, uuid='MIG-8932f937-...', mig=MigInstance(slot=0, gpu_instance_id=1, compute_instance_id=0))]
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

from rnnmon.gpu.cuda_devices import cuda_device_uuids
from rnnmon.gpu.nvml import FUNCTION_NOT_FOUND, NO_PERMISSION, NOT_FOUND, NOT_SUPPORTED, Nvml

DeviceChoice = Literal["auto", "all"] | Sequence[int]
_GPU_NAME = re.compile(r"(?:^|[/:])GPU:(\d+)$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class MigInstance:
    slot: int  # index for nvmlDeviceGetMigDeviceHandleByIndex on the parent GPU
    gpu_instance_id: int
    compute_instance_id: int


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """One device to watch: a whole GPU, or a MIG device inside the GPU with NVML index `index`."""

    index: int  # NVML index of the physical GPU (the parent of a MIG device)
    uuid: str  # the device's own UUID, as NVML spells it: "GPU-..." or "MIG-..."
    mig: MigInstance | None = None


def select_devices(nvml: Nvml, choice: DeviceChoice = "auto", environ: dict[str, str] | None = None, *,
                   model_ordinals: list[int] | None = None,
                   cuda: Callable[[], list[str] | None] = cuda_device_uuids) -> list[GpuTarget]:
    """Devices to sample: every GPU ("all"), NVML indices, or ("auto") the CUDA devices in `model_ordinals`.

    `cuda` answers CUDA's device UUIDs in CUDA order (None when unknown); tests pass a scripted list.
    """
    if not nvml.available:
        return []
    inventory = nvml_inventory(nvml)
    physical = [t for t in inventory if t.mig is None]
    if choice == "all":
        return physical
    if not isinstance(choice, str):
        by_index = {t.index: t for t in physical}
        unknown = [i for i in choice if i not in by_index]
        if unknown:
            raise ValueError(f"rnnmon: no GPU with NVML index {unknown} that this process may query; it may "
                             f"query {sorted(by_index)}. Received: devices={list(choice)!r}")
        return [by_index[i] for i in choice]
    visible = cuda_visible(inventory, os.environ if environ is None else environ, cuda())
    if model_ordinals:
        chosen = [visible[k] for k in sorted(set(model_ordinals)) if k < len(visible) and visible[k] is not None]
        if chosen:
            return chosen
    known = [t for t in visible if t is not None]
    used = [t for t in known if os.getpid() in (_pids_on(nvml, t) or set())]
    return used or known


def nvml_inventory(nvml: Nvml) -> list[GpuTarget]:
    """Every GPU this process may query, then the MIG devices inside them. NVML also counts GPUs a cgroup
    hides (their handle answers NO_PERMISSION): those are skipped."""
    count = nvml.query("nvmlDeviceGetCount", label="device count") or 0
    found: list[GpuTarget] = []
    for index in range(count):
        handle = nvml.query("nvmlDeviceGetHandleByIndex", index, label="device handle", device=index,
                            quiet={NO_PERMISSION: None})
        uuid = handle and _text(nvml.query("nvmlDeviceGetUUID", handle, label="device UUID", device=index))
        if not uuid:
            continue
        found.append(GpuTarget(index, uuid))
        mode = nvml.query("nvmlDeviceGetMigMode", handle, label="MIG mode", device=index,
                          quiet={NOT_SUPPORTED: None, FUNCTION_NOT_FOUND: None})
        if not mode or mode[0] != 1:
            continue
        slots = nvml.query("nvmlDeviceGetMaxMigDeviceCount", handle, label="MIG devices", device=index) or 0
        for slot in range(slots):
            mig = nvml.query("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, label="MIG devices",
                             device=index, quiet={NOT_FOUND: None})
            if mig is None:
                continue
            mig_uuid = _text(nvml.query("nvmlDeviceGetUUID", mig, label="MIG devices", device=index))
            gi = nvml.query("nvmlDeviceGetGpuInstanceId", mig, label="MIG devices", device=index)
            ci = nvml.query("nvmlDeviceGetComputeInstanceId", mig, label="MIG devices", device=index)
            if mig_uuid and gi is not None and ci is not None:
                found.append(GpuTarget(index, mig_uuid, MigInstance(slot, gi, ci)))
    return found


def cuda_visible(inventory: list[GpuTarget], environ: dict[str, str] | os._Environ[str],
                 cuda_uuids: list[str] | None) -> list[GpuTarget | None]:
    """The NVML device of each CUDA ordinal (None where a UUID matches nothing NVML may query)."""
    if cuda_uuids is not None:
        return [resolve_uuid(uuid, inventory) for uuid in cuda_uuids]
    physical = [t for t in inventory if t.mig is None]
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(physical)  # assumes CUDA's order is NVML's (PCI) order; CUDA's own list says for sure
    chosen: list[GpuTarget | None] = []
    for item in (part.strip() for part in spec.split(",")):
        if item.isdigit():
            target = physical[int(item)] if int(item) < len(physical) else None
        else:
            target = resolve_uuid(item, inventory)
        if target is None:
            break  # CUDA ignores everything after the first invalid entry
        chosen.append(target)
        if target.mig is not None:
            break  # CUDA enumerates at most one MIG device per process
    return chosen


def resolve_uuid(spec: str, inventory: list[GpuTarget]) -> GpuTarget | None:
    """The device a CUDA UUID names: full or unique short "GPU-..." prefixes, "MIG-<uuid>",
    "MIG-GPU-<uuid>/<gpu instance>/<compute instance>", or the bare hex CUDA's driver API gives."""
    spec = spec.strip()
    if spec.startswith("MIG-GPU-"):
        parent_spec, _, ids = spec[len("MIG-"):].partition("/")
        gi, _, ci = ids.partition("/")
        parent = _by_prefix(parent_spec, [t for t in inventory if t.mig is None])
        if parent is None or not (gi.isdigit() and ci.isdigit()):
            return None
        return next((t for t in inventory if t.mig is not None and t.index == parent.index
                     and (t.mig.gpu_instance_id, t.mig.compute_instance_id) == (int(gi), int(ci))), None)
    if spec.startswith("GPU-"):
        return _by_prefix(spec, [t for t in inventory if t.mig is None])
    if spec.startswith("MIG-"):
        return _by_prefix(spec, [t for t in inventory if t.mig is not None])
    return _by_prefix(spec, inventory)


def _by_prefix(spec: str, candidates: list[GpuTarget]) -> GpuTarget | None:
    wanted = _bare(spec).lower()
    if not wanted:
        return None
    exact = [t for t in candidates if _bare(t.uuid).lower() == wanted]
    if exact:
        return exact[0]
    matches = [t for t in candidates if _bare(t.uuid).lower().startswith(wanted)]
    return matches[0] if len(matches) == 1 else None  # CUDA rejects an ambiguous prefix


def _bare(uuid: str) -> str:
    return uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid


def open_target(nvml: Nvml, target: GpuTarget) -> tuple[Any, Any] | None:
    """(GPU handle, device handle): the parent and the MIG device's own handle, or the GPU's twice."""
    parent = nvml.query("nvmlDeviceGetHandleByIndex", target.index, label="device handle", device=target.index)
    if parent is None or target.mig is None:
        return None if parent is None else (parent, parent)
    own = nvml.query("nvmlDeviceGetMigDeviceHandleByIndex", parent, target.mig.slot, label="MIG device handle",
                     device=target.index)
    return None if own is None else (parent, own)


def _pids_on(nvml: Nvml, target: GpuTarget) -> set[int] | None:
    """Process ids NVML lists on the device; None when the query fails (no permission, not supported)."""
    handles = open_target(nvml, target)
    if handles is None:
        return None
    processes = nvml.query("nvmlDeviceGetComputeRunningProcesses", handles[1], label="process list",
                           device=target.index, quiet={NO_PERMISSION: None, NOT_SUPPORTED: None})
    return None if processes is None else {process.pid for process in processes}


def process_on_devices(nvml: Nvml, targets: list[GpuTarget]) -> bool | None:
    """True if NVML lists this process on one of `targets`; False only if every query worked and those
    devices list no process at all; None (unknown) otherwise.

    Inside a container NVML reports host process ids, so "other processes but not ours" is unknown too.
    """
    if not targets:
        return None
    listed = [_pids_on(nvml, t) for t in targets]
    if any(os.getpid() in pids for pids in listed if pids is not None):
        return True
    if any(pids is None for pids in listed):
        return None
    return False if not set().union(*listed) else None


def backend_gpu_count(backend: str) -> int | None:
    """GPUs the active Keras backend can compute on; None when its framework is not loaded or cannot say."""
    try:
        if backend == "tensorflow" and "tensorflow" in sys.modules:
            return len(sys.modules["tensorflow"].config.list_physical_devices("GPU"))
        if backend == "jax" and "jax" in sys.modules:
            return len([d for d in sys.modules["jax"].devices() if d.platform in ("gpu", "cuda", "rocm")])
        if backend == "torch" and "torch" in sys.modules:
            torch = sys.modules["torch"]
            return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a framework quirk must not stop monitoring
        return None
    return None


def model_cuda_ordinals(model: Any, backend: str) -> list[int] | None:
    """CUDA ordinals of the GPUs `model` computes on; None when it computes on none the backend shows."""
    try:
        if backend == "tensorflow":
            ordinals = _tensorflow_ordinals(model)
        elif backend == "jax":
            ordinals = _jax_ordinals(model)
        elif backend == "torch":
            ordinals = _torch_ordinals(model)
        else:
            return None
    except Exception:  # a framework quirk must not stop monitoring
        return None
    return sorted(set(ordinals)) or None


def gpu_ordinal(device_name: str) -> int | None:
    """The k of a TensorFlow device name ending in "GPU:k" ("/job:localhost/replica:0/task:0/device:GPU:1")."""
    match = _GPU_NAME.search(device_name or "")
    return None if match is None else int(match.group(1))


def _tensorflow_ordinals(model: Any) -> list[int]:
    tf = sys.modules["tensorflow"]
    physical = tf.config.get_visible_devices("GPU")
    if not physical:
        return []
    names = []
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and type(strategy).__name__ != "_DefaultDistributionStrategy":
        names += list(strategy.extended.worker_devices)
    for variable in getattr(model, "weights", [])[:1]:
        value = getattr(variable, "value", variable)
        names += [v.device for v in getattr(value, "values", [value])]
    logical = [gpu_ordinal(name) for name in names]
    logical = [k for k in logical if k is not None]
    if not names:  # not built yet: TensorFlow's default device is the first GPU
        logical = [0]
    cuda = [gpu_ordinal(device.name) for device in physical]
    if len(tf.config.list_logical_devices("GPU")) != len(physical):  # virtual GPUs: no 1:1 map
        return [k for k in cuda if k is not None]
    return [cuda[k] for k in logical if k < len(cuda) and cuda[k] is not None]


def _jax_ordinals(model: Any) -> list[int]:
    jax = sys.modules["jax"]
    devices = [d for variable in getattr(model, "weights", [])[:1] for d in variable.value.devices()]
    devices = devices or jax.devices()[:1]  # not built yet: JAX's default device
    return [d.local_hardware_id if getattr(d, "local_hardware_id", None) is not None else d.id
            for d in devices if d.platform in ("gpu", "cuda")]


def _torch_ordinals(model: Any) -> list[int]:
    torch = sys.modules["torch"]
    devices = [variable.value.device for variable in getattr(model, "weights", [])[:1]]
    if not devices and torch.cuda.is_available():  # not built yet: Keras puts torch tensors on cuda
        devices = [torch.device("cuda")]
    return [d.index if d.index is not None else torch.cuda.current_device() for d in devices if d.type == "cuda"]


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
