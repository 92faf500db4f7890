"""The `fit` call a callback runs in: the user's own `x`, fit's batch size, its epoch iterator and CallbackList.

Keras hands a callback the model, not the input. But `Model.fit` (TensorFlow, JAX and torch backends alike)
calls `callbacks.on_train_begin()` with these as its local variables, so the frames above the hook reach
them. Auditing the user's `x` rather than the tf.data pipeline Keras builds from it keeps Keras's own stages
(the `.map(permutation)` and batching it adds to NumPy arrays, the generator wrapping it puts around a
`PyDataset`) out of the findings, and gives the callback exactly what `rnnmon.audit(model, x)` sees.

Example:
    >>> class Probe(keras.callbacks.Callback):
    ...     def on_train_begin(self, logs=None):
    ...         self.fit = find_fit_call(self.model)
    >>> model.fit(x, y, batch_size=16, callbacks=[probe]); probe.fit.batch_size
    16
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

_MAX_DEPTH = 12  # the hook, CallbackList.on_train_begin, fit's traceback filter, fit


@dataclasses.dataclass(frozen=True)
class FitCall:
    x: Any  # what the user passed to fit (after validation_split, the training part)
    batch_size: int | None
    epoch_iterator: Any  # Keras's EpochIterator for the training data
    callbacks: Any  # Keras's CallbackList: every callback of this fit, in call order


def find_fit_call(model: Any) -> FitCall | None:
    """The `fit(...)` of `model` that the calling hook runs in, or None (e.g. a custom training loop)."""
    frame = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        frame = frame.f_back
        if frame is None:
            return None
        if frame.f_code.co_name != "fit":
            continue
        variables = frame.f_locals
        if variables.get("self") is model and "epoch_iterator" in variables and "callbacks" in variables:
            return FitCall(variables.get("x"), variables.get("batch_size"), variables["epoch_iterator"],
                           variables["callbacks"])
    return None
