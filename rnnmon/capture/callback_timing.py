"""Times the batch hooks of the other callbacks in a fit, so host time between steps can be put on a name.

Keras's `CallbackList` (reached through the fit call at `on_train_begin`, see `rnnmon.capture.fit_scope`) calls each
callback's `on_train_batch_begin` / `on_train_batch_end` in turn. For the fit, each of those methods is
shadowed by an instance attribute that adds up its time; `remove()` deletes the attributes again.

Example:
    >>> timing = CallbackTiming(fit.callbacks.callbacks, skip=monitor)
    >>> ...                                      # the fit runs
    >>> timing.remove(); timing.totals_s()
    {'ProgbarLogger': 0.41, 'History': 0.0004}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

HOOKS = ("on_train_batch_begin", "on_train_batch_end")


class CallbackTiming:
    def __init__(self, callbacks: list[Any], skip: Any) -> None:
        self._totals: dict[str, float] = {}
        self._patched: list[tuple[Any, str]] = []
        for callback in callbacks:
            if callback is skip:
                continue
            name = type(callback).__name__
            self._totals.setdefault(name, 0.0)
            for hook in HOOKS:
                if hook not in vars(callback):  # not already shadowed (by rnnmon or the user)
                    setattr(callback, hook, self._timed(name, getattr(callback, hook)))
                    self._patched.append((callback, hook))

    def _timed(self, name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
        totals, clock = self._totals, time.perf_counter

        def timed_hook(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return hook(*args, **kwargs)
            finally:
                totals[name] += clock() - start

        return timed_hook

    def remove(self) -> None:
        for callback, hook in self._patched:
            vars(callback).pop(hook, None)
        self._patched.clear()

    def totals_s(self) -> dict[str, float]:
        """Seconds spent in each callback class's batch hooks so far."""
        return dict(self._totals)
