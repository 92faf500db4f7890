"""The one place rnnmon talks to NVML: every call goes through `Nvml.query`.

Failures never raise. An unsupported or missing function, or a lost GPU, becomes `None` (recorded as NA,
never as 0) and is logged once. Without the NVML library rnnmon announces CPU-only mode in one log line.

Example:
    >>> nvml = Nvml()
    >>> if nvml.start():
    ...     handle = nvml.query("nvmlDeviceGetHandleByIndex", 0)
    ...     power_mw = nvml.query("nvmlDeviceGetPowerUsage", handle, label="power", device=0)
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

LOG = logging.getLogger("rnnmon")

# NVML return codes that mean "this device is gone": stop asking it.
_GPU_LOST_CODES = frozenset({15, 16})  # NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED


class Nvml:
    """Lazily started NVML session whose queries answer `None` instead of raising."""

    def __init__(self) -> None:
        self._pynvml: Any = None
        self._lock = threading.Lock()
        self._warned: set[tuple[str, int | None]] = set()
        self.lost: set[int] = set()  # device indices that answered GPU_IS_LOST

    @property
    def available(self) -> bool:
        return self._pynvml is not None

    def start(self) -> bool:
        """Initialise NVML; on failure say once that rnnmon runs in CPU-only mode."""
        with self._lock:
            if self._pynvml is not None:
                return True
            try:
                import pynvml

                pynvml.nvmlInit()
            except ImportError:
                LOG.warning("rnnmon: the pynvml module (nvidia-ml-py) is not installed; CPU-only mode: "
                            "step timing works, GPU metrics are off.")
                return False
            except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                LOG.warning("rnnmon: NVML is unavailable (%s); CPU-only mode: step timing works, "
                            "GPU metrics are off.", _describe(error))
                return False
            self._pynvml = pynvml
            return True

    def shutdown(self) -> None:
        with self._lock:
            if self._pynvml is None:
                return
            with contextlib.suppress(Exception):  # shutting down must not raise
                self._pynvml.nvmlShutdown()
            self._pynvml = None

    def constant(self, name: str) -> Any:
        return getattr(self._pynvml, name)

    def query(self, function: str, *args: Any, label: str | None = None, device: int | None = None,
              quiet: dict[int, Any] | None = None, **kwargs: Any) -> Any:
        """Call `pynvml.<function>(*args, **kwargs)`; answer `None` (and warn once per label and device) on
        failure. `quiet` maps NVML return codes that are expected to the answer they stand for."""
        if self._pynvml is None or device in self.lost:
            return None
        try:
            return getattr(self._pynvml, function)(*args, **kwargs)
        except Exception as error:  # NVML faults must never reach training
            code = getattr(error, "value", None)
            if quiet and code in quiet:
                return quiet[code]
            self._note_failure(function, label or function, device, error)
            return None

    def _note_failure(self, function: str, label: str, device: int | None, error: Exception) -> None:
        code = getattr(error, "value", None)
        if device is not None and code in _GPU_LOST_CODES:
            if device not in self.lost:
                self.lost.add(device)
                LOG.warning("rnnmon: GPU %d is lost (%s); its metrics are NA from now on.",
                            device, _describe(error))
            return
        if (label, device) in self._warned:
            return
        self._warned.add((label, device))
        where = "" if device is None else f" on GPU {device}"
        LOG.warning("rnnmon: %s is unavailable%s (%s: %s); it is recorded as NA.",
                    label, where, function, _describe(error))


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
