"""The `fit` call a callback runs in: when it has ended, and what the user passed to it.

Keras calls `on_train_end` only when `fit` ends normally; an exception in a later callback skips it. The
`fit` frame is found on the training thread's stack at `on_train_begin`; the fit is over once that frame is
no longer on the thread's stack (returned or raised) or the thread is gone. `HookGuard` notices an exception
from any callback's hook at once, before it leaves `fit`.

Keras hands a callback the model, not the input. But `Model.fit` (TensorFlow, JAX and torch backends alike)
calls `callbacks.on_train_begin()` with the user's `x`, the batch size, its epoch iterator and its
CallbackList as local variables, so the same frame reaches them (`call()`). Auditing the user's `x` rather
than the tf.data pipeline Keras builds from it keeps Keras's own stages out of the findings.

Example:
    >>> scope = FitScope.find(model)      # in on_train_begin
    >>> scope.over()                      # from the background thread: False while fit runs
    >>> scope.running(sys._getframe(1))   # in a function `fit` calls: True at the cost of one comparison
    >>> scope.same_fit(other_scope)       # two callbacks in one callbacks list
    >>> scope.call().batch_size           # in on_train_begin: what fit was given
    >>> guard = HookGuard(scope.call().callbacks, on_raise=lambda error: ...)
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

# The hooks `fit` calls on its CallbackList (evaluate's included: fit passes it the same list).
FIT_HOOKS = ("on_epoch_begin", "on_epoch_end", "on_train_batch_begin", "on_train_batch_end", "on_test_begin",
             "on_test_end", "on_test_batch_begin", "on_test_batch_end", "on_train_end")


@dataclasses.dataclass(frozen=True)
class FitCall:
    x: Any  # what the user passed to fit (after validation_split, the training part)
    batch_size: int | None
    epoch_iterator: Any  # Keras's EpochIterator for the training data
    callbacks: Any  # Keras's CallbackList: every callback of this fit, in call order


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

    def call(self) -> FitCall | None:
        """The arguments and helpers of this `fit`, or None where the frame is unknown or unlike Keras's."""
        variables = self._frame.f_locals if self._frame is not None else {}
        if "epoch_iterator" not in variables or "callbacks" not in variables:
            return None
        return FitCall(variables.get("x"), variables.get("batch_size"), variables["epoch_iterator"],
                       variables["callbacks"])

    def forget(self) -> None:
        """Drop the frame (it holds the fit's locals: the model, the data iterators)."""
        self._frame = None


class HookGuard:
    """Calls `on_raise(error)` when a hook of a fit's CallbackList raises, then lets the error go on.

    Each hook is shadowed by an instance attribute on the list (`remove()` deletes them), so a callback that
    raises anywhere in the fit is seen in its own call, not at the next poll. `StopIteration` is not an error:
    Keras ends the epoch on it.
    """

    def __init__(self, callbacks: Any, on_raise: Callable[[BaseException], None]) -> None:
        self._callbacks = callbacks
        self._hooks = [hook for hook in FIT_HOOKS if hook not in vars(callbacks)]
        for hook in self._hooks:
            setattr(callbacks, hook, _guarded(getattr(callbacks, hook), on_raise))

    def remove(self) -> None:
        for hook in self._hooks:
            vars(self._callbacks).pop(hook, None)
        self._hooks = []


def _guarded(hook: Callable[..., Any], on_raise: Callable[[BaseException], None]) -> Callable[..., Any]:
    def guarded_hook(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except StopIteration:
            raise
        except BaseException as error:
            on_raise(error)
            raise

    return guarded_hook


def _fit_codes(model_type: type) -> set[CodeType]:
    codes = set()
    for klass in model_type.__mro__:
        fit = klass.__dict__.get("fit")
        if fit is not None:
            code = getattr(inspect.unwrap(fit), "__code__", None)
            if code is not None:
                codes.add(code)
    return codes
