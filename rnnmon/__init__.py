"""rnnmon: per-step answers to "why is my GPU idle?" for Keras recurrent models.

Example:
    >>> import rnnmon
    >>> model.fit(dataset, callbacks=[rnnmon.UtilizationMonitor("runs/exp1")])
"""

from rnnmon.findings import Finding
from rnnmon.monitor import UtilizationMonitor

__all__ = ["Finding", "UtilizationMonitor"]
__version__ = "0.1.0"
