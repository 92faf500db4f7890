"""rnnmon: per-step answers to "why is my GPU idle?" for Keras recurrent models.

Example:
    >>> import rnnmon
    >>> model.fit(dataset, callbacks=[rnnmon.UtilizationMonitor("runs/exp1")])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rnnmon.audit.model_and_input import audit
from rnnmon.findings import Finding

if TYPE_CHECKING:
    from rnnmon.monitor import UtilizationMonitor

__all__ = ["Finding", "UtilizationMonitor", "audit"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Keras (and with it TensorFlow) loads only when the callback is used, so `rnnmon report` starts fast.
    if name == "UtilizationMonitor":
        from rnnmon.monitor import UtilizationMonitor

        return UtilizationMonitor
    raise AttributeError(f"module 'rnnmon' has no attribute {name!r}")
