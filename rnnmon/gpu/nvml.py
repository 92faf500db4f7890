"""The one place rnnmon talks to NVML: every call goes through `Nvml.query` (or `Nvml.query_code`).

Failures never raise. An unsupported or missing function, or a lost GPU, becomes `None` (recorded as NA,
never as 0) and is logged once. A call that does not answer within `deadline_s` is abandoned on its own
thread with one warning, and that metric is NA from then on: a hung driver call never stalls polling.
Without the NVML library rnnmon announces CPU-only mode in one log line per process (NVML cannot appear later in
it): a notebook's many monitors, or a KerasTuner search's trials, say it once.

Example:
    >>> nvml = Nvml()
    >>> if nvml.start():
    ...     handle = nvml.query("nvmlDeviceGetHandleByIndex", 0)
    ...     power_mw = nvml.query("nvmlDeviceGetPowerUsage", handle, label="power", device=0)
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger("rnnmon")

# NVML return codes (nvml.h nvmlReturn_t).
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
FUNCTION_NOT_FOUND = 13
_GPU_LOST_CODES = frozenset({15, 16})  # NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED
DEFAULT_DEADLINE_S = 2.0  # NVML calls take µs to ~20 ms (PCIe throughput); seconds means the driver hangs
_cpu_only_said: str | None = None  # the reason this process last announced CPU-only mode for
_CPU_ONLY_LOCK = threading.Lock()


class _Call:
    """One NVML call handed to the caller thread; `done` is set when it has answered."""

    def __init__(self, function: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> None:
        self.function, self.args, self.kwargs = function, args, kwargs
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _Caller:
    """A daemon thread that runs NVML calls in order; abandoned (and left to finish alone) when one hangs."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="rnnmon-nvml", daemon=True).start()

    def submit(self, call: _Call) -> None:
        self._calls.put(call)

    def stop(self) -> None:
        self._calls.put(None)

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call.result = call.function(*call.args, **call.kwargs)
            except BaseException as error:  # handed back to the waiting thread
                call.error = error
            call.done.set()


class _Overran(Exception):
    pass


class Nvml:
    """Lazily started NVML session whose queries answer `None` instead of raising or hanging."""

    def __init__(self, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self._pynvml: Any = None  # the module while the session is open
        self._module: Any = None  # the module once imported: its constants outlive the session
        self._lock = threading.Lock()
        self._caller_lock = threading.Lock()
        self._caller: _Caller | None = None
        self.deadline_s = deadline_s
        self._warned: set[tuple[str, int | None]] = set()  # shared with `fresh()` sessions
        self._hung: set[tuple[str, int | None]] = set()
        self.lost: set[int] = set()  # device indices that answered GPU_IS_LOST

    def fresh(self) -> Nvml:
        """A new, unstarted session that shares this one's memory of the failures it warned about (a monitor's
        copies, one per KerasTuner trial, warn about a device once)."""
        twin = Nvml(self.deadline_s)
        twin._warned = self._warned
        return twin

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
                self._say_cpu_only("the pynvml module (nvidia-ml-py) is not installed")
                return False
            except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                self._say_cpu_only(f"NVML is unavailable ({_describe(error)})")
                return False
            self._pynvml = self._module = pynvml
            _said_cpu_only(None)
            return True

    def _say_cpu_only(self, reason: str) -> None:
        """One log line per process and reason: said again only if the reason changes, or NVML started between."""
        if _said_cpu_only(reason) != reason:
            LOG.warning("rnnmon: %s; CPU-only mode: step timing works, GPU metrics are off.", reason)

    def shutdown(self) -> None:
        with self._caller_lock:
            if self._caller is not None:
                self._caller.stop()
                self._caller = None
        with self._lock:
            if self._pynvml is None:
                return
            with contextlib.suppress(Exception):  # shutting down must not raise
                self._pynvml.nvmlShutdown()
            self._pynvml = None

    def constant(self, name: str) -> Any:
        """A pynvml constant or struct type; still answered after `shutdown()`, which can come while a sampler
        thread is half-way through a poll (its queries then answer None)."""
        return getattr(self._module, name)

    def query(self, function: str, *args: Any, label: str | None = None, device: int | None = None,
              quiet: dict[int, Any] | None = None, **kwargs: Any) -> Any:
        """Call `pynvml.<function>(*args, **kwargs)`; answer `None` (and warn once per label and device) on
        failure. `quiet` maps NVML return codes that are expected to the answer they stand for."""
        return self.query_code(function, *args, label=label, device=device, quiet=quiet, **kwargs)[0]

    def query_code(self, function: str, *args: Any, label: str | None = None, device: int | None = None,
                   quiet: dict[int, Any] | None = None, **kwargs: Any) -> tuple[Any, int | None]:
        """`query`, plus the NVML return code of a failure (None on success, or when there is no code)."""
        key = (label or function, device)
        module = self._pynvml
        if module is None or device in self.lost or key in self._hung:
            return None, None
        try:
            return self._call(getattr(module, function), args, kwargs), None
        except _Overran:
            self._hung.add(key)
            LOG.warning("rnnmon: %s did not answer within %.1f s%s (%s); it is recorded as NA from now on.",
                        key[0], self.deadline_s, "" if device is None else f" on GPU {device}", function)
            return None, None
        except Exception as error:  # NVML faults must never reach training
            if self._pynvml is None:  # shut down during the call (the end of fit, while the sampler polls)
                return None, None
            code = getattr(error, "value", None)
            if quiet and code in quiet:
                return quiet[code], code
            self._note_failure(function, key[0], device, error)
            return None, code

    def _call(self, function: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        call = _Call(function, args, kwargs)
        with self._caller_lock:
            caller = self._caller = self._caller or _Caller()
        caller.submit(call)
        if not call.done.wait(self.deadline_s):
            with self._caller_lock:  # leave the hung thread behind; the next call gets a fresh one
                if self._caller is caller:
                    self._caller = None
            caller.stop()
            raise _Overran
        error, call.error = call.error, None
        if error is None:
            return call.result
        try:
            raise error
        finally:  # neither `call` nor this frame may keep the error: its traceback holds this frame (a cycle)
            del error

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


def _said_cpu_only(reason: str | None) -> str | None:
    """Record `reason` (None: NVML started) as this process's CPU-only announcement; the one before it."""
    global _cpu_only_said
    with _CPU_ONLY_LOCK:
        before, _cpu_only_said = _cpu_only_said, reason
    return before


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
