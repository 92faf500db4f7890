"""Times the batch hooks of the other callbacks in a fit, and stamps when a step's hooks end and begin.

Keras's `CallbackList` (reached through the fit call at `on_train_begin`, see `rnnmon.capture.fit_scope`) calls each
callback's `on_train_batch_begin` / `on_train_batch_end` in turn. For the fit, each of those methods is
shadowed by an instance attribute that adds up its time; `remove()` deletes the attributes again.

The same shadows mark where a step lies between the hooks, wherever the monitor sits in the list: `on_begun`
gets the time the last callback's `on_train_batch_begin` returned (the step's compute starts after it), and
`on_ended` the time the first callback's `on_train_batch_end` was called (Keras has by then turned the step's
outputs into numbers, so the device has finished it). Every callback's hooks then lie between steps. Likewise
`on_epoch_ending` gets the time the first callback's `on_epoch_end` was called (validation has returned).
`stamps_begin` / `stamps_end` / `stamps_epoch_end` say whether those ends of the list could be shadowed (not when
the callback is `skip`, or its hook is already an instance attribute): where not, the monitor's own hook stands
in.

`on_profiler` gets the start and end of each hook call that started or stopped (and saved) a profiler trace: one
after which the callback's `_is_tracing` differs (Keras's `TensorBoard(profile_batch=...)` sets it).

Example:
    >>> timing = CallbackTiming(fit.callbacks.callbacks, skip=monitor, on_begun=..., on_ended=...)
    >>> ...                                      # the fit runs
    >>> timing.remove(); timing.totals_s()
    {'ProgbarLogger': 0.41, 'History': 0.0004}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

HOOKS = ("on_train_batch_begin", "on_train_batch_end")
Stamp = Callable[[float], None]
Span = Callable[[float, float], None]


class CallbackTiming:
    def __init__(self, callbacks: list[Any], skip: Any, on_begun: Stamp | None = None,
                 on_ended: Stamp | None = None, on_epoch_ending: Stamp | None = None,
                 on_profiler: Span | None = None) -> None:
        self._totals: dict[str, float] = {}
        self._patched: list[tuple[Any, str]] = []
        self.stamps_begin = self.stamps_end = self.stamps_epoch_end = False
        first = callbacks[0] if callbacks else skip
        if on_epoch_ending is not None and first is not skip and "on_epoch_end" not in vars(first):
            first.on_epoch_end = self._stamped(first.on_epoch_end, on_epoch_ending)
            self._patched.append((first, "on_epoch_end"))
            self.stamps_epoch_end = True
        for index, callback in enumerate(callbacks):
            if callback is skip:
                continue
            name = type(callback).__name__
            self._totals.setdefault(name, 0.0)
            for hook in HOOKS:
                if hook not in vars(callback):  # not already shadowed (by rnnmon or the user)
                    begun = on_begun if hook == HOOKS[0] and index == len(callbacks) - 1 else None
                    ended = on_ended if hook == HOOKS[1] and index == 0 else None
                    profiler = on_profiler if hasattr(callback, "_is_tracing") else None
                    setattr(callback, hook, self._timed(name, getattr(callback, hook), begun, ended,
                                                        callback if profiler else None, profiler))
                    self._patched.append((callback, hook))
                    self.stamps_begin |= begun is not None
                    self.stamps_end |= ended is not None

    def _timed(self, name: str, hook: Callable[..., Any], begun: Stamp | None, ended: Stamp | None,
               tracer: Any = None, profiler: Span | None = None) -> Callable[..., Any]:
        totals, clock, patched = self._totals, time.perf_counter, self._patched

        def timed_hook(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            if ended is not None and patched:  # (a wrapper left behind by a fit that ended stamps nothing)
                ended(start)
            tracing = getattr(tracer, "_is_tracing", None)
            try:
                return hook(*args, **kwargs)
            finally:
                now = clock()
                totals[name] += now - start
                if profiler is not None and patched and getattr(tracer, "_is_tracing", None) != tracing:
                    profiler(start, now)
                if begun is not None and patched:
                    begun(now)

        return timed_hook

    def _stamped(self, hook: Callable[..., Any], stamp: Stamp) -> Callable[..., Any]:
        clock, patched = time.perf_counter, self._patched

        def stamped_hook(*args: Any, **kwargs: Any) -> Any:
            if patched:
                stamp(clock())
            return hook(*args, **kwargs)

        return stamped_hook

    def remove(self) -> None:
        for callback, hook in self._patched:
            vars(callback).pop(hook, None)
        self._patched.clear()

    def totals_s(self) -> dict[str, float]:
        """Seconds spent in each callback class's batch hooks so far."""
        return dict(self._totals)
