"""Static check of a Keras model: preprocessing layers inside it that do string or lookup work on every step.

`TextVectorization`, `StringLookup`, `IntegerLookup`, `Hashing` and `HashedCrossing` run on the CPU (string
ops, hash tables) each time the model is called. Inside the model they run in the training step, where the
accelerator waits for them, every epoch again; in the tf.data pipeline they run ahead on its threads.

Example:
    >>> inputs = keras.Input((1,), dtype="string")
    >>> tokens = keras.layers.TextVectorization(max_tokens=100, output_sequence_length=20)(inputs)
    >>> [f.code for f in audit_preprocessing(keras.Model(inputs, tokens))]
    ['PREPROCESSING_IN_MODEL']
"""

from __future__ import annotations

from typing import Any

from rnnmon.findings import Finding

CPU_LAYERS = ("TextVectorization", "StringLookup", "IntegerLookup", "Hashing", "HashedCrossing")


def audit_preprocessing(model: Any) -> list[Finding]:
    """PREPROCESSING_IN_MODEL for each CPU-bound preprocessing layer inside `model` (nested models included)."""
    import keras

    kinds = tuple(getattr(keras.layers, name) for name in CPU_LAYERS if hasattr(keras.layers, name))
    flagged = [layer for layer in model._flatten_layers(include_self=False, recursive=True)
               if isinstance(layer, kinds)]
    inner = {id(part) for layer in flagged for part in layer._flatten_layers(include_self=False, recursive=True)}
    findings = []
    for layer in flagged:
        if id(layer) in inner:  # TextVectorization's own StringLookup
            continue
        kind = type(layer).__name__
        message = (f"{kind} '{layer.name}' is inside the model: its string and lookup work runs on the CPU in "
                   "every training step, while the accelerator waits, and again every epoch.")
        advice = (f"Apply it in the input pipeline instead: `ds = ds.map(lambda x, y: ({layer.name}(x), y), "
                  "num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)` and train the model from its "
                  "output; keep a model with the layer for inference on raw inputs.")
        findings.append(Finding.of("PREPROCESSING_IN_MODEL", layer.name, message, advice))
    return findings
