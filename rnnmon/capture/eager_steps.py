"""Whether a training step runs eagerly (op by op from Python), from the framework's own dispatch, on one step.

A compiled step hands the framework one program per call: a `tf.function` is one `TFE_Py_Execute`, a `jax.jit`
call never reaches JAX's Python dispatch. An eager step dispatches every op from Python: TensorFlow's
`TFE_Py_FastPathExecute` (834 of them for a 16-unit LSTM's GradientTape step, against 1 under `tf.function`),
JAX's `apply_primitive` (77, against 0 under `jax.jit`). `EagerProbe` counts those calls over one step with
`sys.setprofile` and times the step's part inside them; the Python between them is what compiling removes
(rnnmon.analysis.measured's EAGER_STEP). The profile hook slows that one step (about 2x); another profiler
already set (cProfile, a debugger) is left alone, and nothing is probed.

Example:
    >>> probe = EagerProbe("tensorflow")
    >>> probe.start(); train_step(x, y); probe.stop()
    {'framework': 'tensorflow', 'ops': 834, 'in_ops_ms': 212.4}
"""

from __future__ import annotations

import sys
import time
from types import FrameType
from typing import Any

_TF_OPS = frozenset({"TFE_Py_FastPathExecute", "TFE_Py_Execute"})  # TensorFlow's eager op (and function) calls


class EagerProbe:
    """Counts the ops a step dispatches from Python on `backend` ("tensorflow" or "jax"; others: nothing)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._ops = 0
        self._inside_s = 0.0
        self._since = 0.0
        self._running = False

    def start(self) -> bool:
        """Start counting on this thread; False where it cannot (another profiler is set, another backend)."""
        if self.backend not in ("tensorflow", "jax") or sys.getprofile() is not None:
            return False
        self._ops, self._inside_s, self._running = 0, 0.0, True
        sys.setprofile(self._on_tf_event if self.backend == "tensorflow" else self._on_jax_event)
        return True

    def stop(self) -> dict[str, Any] | None:
        """Stop counting: the framework, the ops dispatched from Python, and the ms spent inside them."""
        if not self._running:
            return None
        sys.setprofile(None)
        self._running = False
        return {"framework": self.backend, "ops": self._ops, "in_ops_ms": round(self._inside_s * 1e3, 3)}

    def _on_tf_event(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") in _TF_OPS:
            self._ops += 1
            self._since = time.perf_counter()
        elif event in ("c_return", "c_exception") and getattr(arg, "__name__", "") in _TF_OPS:
            self._inside_s += time.perf_counter() - self._since

    def _on_jax_event(self, frame: FrameType, event: str, arg: Any) -> None:
        if frame.f_code.co_name != "apply_primitive" or "jax" not in frame.f_code.co_filename:
            return
        if event == "call":
            self._ops += 1
            self._since = time.perf_counter()
        elif event == "return":
            self._inside_s += time.perf_counter() - self._since
