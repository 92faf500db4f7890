"""The monitor must not change what training computes: same losses, same weights, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BATCH, sequences, tiny_model

from rnnmon import UtilizationMonitor


def _train(callbacks, steps_per_execution=1):
    import tensorflow as tf

    x, y = sequences(24)  # at steps_per_execution=8: three executions an epoch
    vx, vy = sequences(4, seed=1)
    model = tiny_model(seed=3, steps_per_execution=steps_per_execution)
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
                        validation_data=tf.data.Dataset.from_tensor_slices((vx, vy)).batch(BATCH),
                        epochs=2, verbose=0, callbacks=callbacks)
    return history.history, model.get_weights()


@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize(("steps_per_execution", "measure"), [
    (1, None), pytest.param(3, True, marks=pytest.mark.slow),
    (8, None),  # executions timed in Python (the warm-up, the first after it) and Keras's in-graph loop mixed
])
def test_losses_and_weights_identical(tmp_path, steps_per_execution, measure):
    plain_history, plain_weights = _train([], steps_per_execution)
    monitor = UtilizationMonitor(str(tmp_path), measure_input_wait=measure)
    watched_history, watched_weights = _train([monitor], steps_per_execution)
    assert watched_history == plain_history
    assert all(np.array_equal(a, b) for a, b in zip(plain_weights, watched_weights))
