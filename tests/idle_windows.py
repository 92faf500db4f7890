"""Windows of host time in which the fake GPU idles: opened and closed by a test or by validation.

Example:
    >>> windows = IdleWindows()
    >>> gpu = FakeGpu(utilization=windows.utilization)        # fake_nvml: 0% inside a window, 90% outside
    >>> model.fit(..., callbacks=[MarkEvaluation(windows), monitor])
"""

from __future__ import annotations

import time

import keras


class IdleWindows:
    """Host-time windows in which the fake GPU reports 0% utilization."""

    def __init__(self) -> None:
        self.windows: list[list[float | None]] = []

    def open(self) -> None:
        self.windows.append([time.time(), None])

    def close(self) -> None:
        self.windows[-1][1] = time.time()

    def utilization(self, t: float) -> float:
        idle = any(start <= t and (end is None or t <= end) for start, end in self.windows)
        return 0.0 if idle else 90.0


class MarkEvaluation(keras.callbacks.Callback):
    def __init__(self, windows: IdleWindows) -> None:
        super().__init__()
        self.windows = windows

    def on_test_begin(self, logs=None):
        self.windows.open()

    def on_test_end(self, logs=None):
        self.windows.close()
