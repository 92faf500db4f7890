"""The monitor must not change what training computes: same losses, same weights, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BATCH, sequences, tiny_model

from rnnmon import UtilizationMonitor


def _train(model, start, callbacks):
    """Fit `model` from the weights and optimizer state `start`, 2 epochs with validation."""
    import tensorflow as tf

    for variable, value in zip(model.variables + model.optimizer.variables, start):
        variable.assign(value)
    x, y = sequences(24)  # at steps_per_execution=8: three executions an epoch
    vx, vy = sequences(4, seed=1)
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
                        validation_data=tf.data.Dataset.from_tensor_slices((vx, vy)).batch(BATCH),
                        epochs=2, verbose=0, callbacks=callbacks)
    return history.history, model.get_weights()


@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize(("steps_per_execution", "measure"), [
    (1, None), pytest.param(3, True, marks=pytest.mark.slow),
    # executions timed in Python (the warm-up, the first after it) and Keras's in-graph loop mixed
    pytest.param(8, None, marks=pytest.mark.slow),
])
def test_losses_and_weights_identical(tmp_path, steps_per_execution, measure):
    # One model trains twice from the same start, so its train and test functions are traced once (1.3-1.5 s of CPU
    # each time): the watched fit still goes its own way, through the monitor's wrapper and the traces it adds.
    model = tiny_model(seed=3, steps_per_execution=steps_per_execution)
    model.optimizer.build(model.trainable_variables)
    start = [variable.numpy() for variable in model.variables + model.optimizer.variables]
    plain_history, plain_weights = _train(model, start, [])
    monitor = UtilizationMonitor(str(tmp_path), measure_input_wait=measure)
    watched_history, watched_weights = _train(model, start, [monitor])
    assert watched_history == plain_history
    assert all(np.array_equal(a, b) for a, b in zip(plain_weights, watched_weights))
