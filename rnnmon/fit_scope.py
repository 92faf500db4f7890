"""The `fit` call a callback runs in, so rnnmon can tell from any thread that it has ended, however it ended.

Keras calls `on_train_end` only when `fit` ends normally; an exception in a later callback skips it. The
`fit` frame is found on the training thread's stack at `on_train_begin`; the fit is over once that frame is
no longer on the thread's stack (returned or raised) or the thread is gone.

Example:
    >>> scope = FitScope.find(model)      # in on_train_begin
    >>> scope.over()                      # from the background thread: False while fit runs
    >>> scope.running(sys._getframe(1))   # in a function `fit` calls: True at the cost of one comparison
    >>> scope.same_fit(other_scope)       # two callbacks in one callbacks list
"""

from __future__ import annotations

import inspect
import sys
import threading
from types import CodeType, FrameType
from typing import Any


class FitScope:
    """One running `fit` call of one model, or an unknown one (`over()` is then always False)."""

    def __init__(self, frame: FrameType | None, thread_id: int) -> None:
        self._frame = frame
        self._thread_id = thread_id

    @classmethod
    def find(cls, model: Any) -> FitScope:
        """The innermost `fit` of `model`'s class hierarchy on the calling thread's stack."""
        codes = _fit_codes(type(model))
        frame = sys._getframe(1)
        while frame is not None and frame.f_code not in codes:
            frame = frame.f_back
        return cls(frame, threading.get_ident())

    @property
    def known(self) -> bool:
        return self._frame is not None

    def same_fit(self, other: FitScope) -> bool:
        return self._frame is not None and self._frame is other._frame

    def running(self, caller: FrameType | None = None) -> bool:
        """True while the fit runs; `caller` (the frame calling a wrapper) answers at once when it is `fit`."""
        return (caller is not None and caller is self._frame) or not self.over()

    def over(self) -> bool:
        if self._frame is None:
            return False
        frame = sys._current_frames().get(self._thread_id)
        while frame is not None:
            if frame is self._frame:
                return False
            frame = frame.f_back
        return True

    def forget(self) -> None:
        """Drop the frame (it holds the fit's locals: the model, the data iterators)."""
        self._frame = None


def _fit_codes(model_type: type) -> set[CodeType]:
    codes = set()
    for klass in model_type.__mro__:
        fit = klass.__dict__.get("fit")
        if fit is not None:
            code = getattr(inspect.unwrap(fit), "__code__", None)
            if code is not None:
                codes.add(code)
    return codes
