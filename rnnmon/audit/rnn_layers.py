"""Static check of a Keras model: which LSTM/GRU layers miss the cuDNN kernel on the active backend, and why.

Whether a fast kernel exists at all depends on the Keras backend and version (`CUDNN_RULES`, each rule naming
the Keras code path it mirrors): TensorFlow has cuDNN LSTM and GRU in every Keras 3; JAX has none through
3.13, from 3.14 a cuDNN LSTM (`jax.experimental.rnn`) that never takes a mask, and a `lax.scan` GRU; torch
has a cuDNN LSTM from 3.10 and GRU from 3.14, and from 3.14 any mask falls back to the generic loop.
Where no fast kernel exists for a layer on that backend the finding says so and names a backend that has
one (the layer arguments cannot help there).

Where one exists, Keras's shared rules apply (keras/src/layers/rnn/lstm.py and gru.py `inner_loop`, and each
backend's `cudnn_ok`): `use_cudnn` is "auto" or True, `recurrent_dropout == 0`, `activation` is the tanh
function object and `recurrent_activation` the sigmoid one (keras.activations, keras.ops, or the backend's
own), `unroll=False`, `use_bias=True` and, for GRU, `reset_after=True`. A generic
`layers.RNN(layers.LSTMCell(...))` never uses it. Input dropout, `go_backwards` and `stateful` are fine. A
masked input keeps the TensorFlow kernel if right-padded (RNN_MASK_RIGHT_PADDING, info); on backends whose
fast path takes no mask, the mask itself is the blocker.

Layers are found through nested models, `Bidirectional` (forward and backward checked separately), wrappers
such as `TimeDistributed`, and custom layers; `where` is the slash path of layer names.

Example:
    >>> inputs = keras.Input((20, 8))
    >>> model = keras.Model(inputs, keras.layers.LSTM(16, recurrent_dropout=0.2, name="lstm")(inputs))
    >>> [(f.code, f.where) for f in audit_rnn_layers(model)]
    [('RNN_NO_FAST_KERNEL', 'lstm')]
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rnnmon.findings import Finding


@dataclasses.dataclass(frozen=True)
class KernelRule:
    """What one backend does for one RNN layer class from one Keras version on."""

    backend: str  # keras.backend.backend()
    layer: str  # "LSTM" or "GRU"
    since: tuple[int, int]  # first Keras (major, minor) this rule holds for
    kernel: bool  # whether a cuDNN kernel exists at all
    mask: str  # with a mask: "right-padded" (kernel runs on right-padded masks), "none" (never with a mask)
    source: str  # the Keras code path this rule mirrors


CUDNN_RULES: tuple[KernelRule, ...] = (
    KernelRule("tensorflow", "LSTM", (3, 0), True, "right-padded",
               "keras/src/backend/tensorflow/rnn.py lstm(): cudnn_ok() then _cudnn_lstm(), mask checked by "
               "_is_sequence_right_padded()"),
    KernelRule("tensorflow", "GRU", (3, 0), True, "right-padded",
               "keras/src/backend/tensorflow/rnn.py gru(): cudnn_ok() then _cudnn_gru()"),
    KernelRule("jax", "LSTM", (3, 0), False, "none",
               "keras/src/backend/jax/rnn.py lstm() raises NotImplementedError (no cuDNN through Keras 3.13)"),
    KernelRule("jax", "LSTM", (3, 14), True, "none",
               "keras/src/backend/jax/rnn.py lstm(): `if mask is not None: raise NotImplementedError`, then "
               "cudnn_ok() and jax.experimental.rnn.lstm"),
    KernelRule("jax", "GRU", (3, 0), False, "none",
               "keras/src/backend/jax/rnn.py gru(): a lax.scan step loop, no cuDNN GRU in jax.experimental.rnn"),
    KernelRule("torch", "LSTM", (3, 0), False, "none",
               "keras/src/backend/torch/rnn.py lstm() raises NotImplementedError (no cuDNN before Keras 3.10)"),
    KernelRule("torch", "LSTM", (3, 10), True, "right-padded",
               "keras/src/backend/torch/rnn.py lstm(): cudnn_ok() then torch's cuDNN LSTM"),
    KernelRule("torch", "LSTM", (3, 14), True, "none",
               "keras/src/backend/torch/rnn.py lstm(): `if mask is not None: raise NotImplementedError`, then "
               "cudnn_ok()"),
    KernelRule("torch", "GRU", (3, 0), False, "none",
               "keras/src/backend/torch/rnn.py gru() raises NotImplementedError (no cuDNN GRU before Keras 3.14)"),
    KernelRule("torch", "GRU", (3, 14), True, "none",
               "keras/src/backend/torch/rnn.py gru(): `if not reset_after or mask is not None: raise "
               "NotImplementedError`, then cudnn_ok()"),
)
_BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}
_MASK_ARGUMENT = "a padding mask"


def kernel_rule(backend: str, layer: str, keras_version: tuple[int, int]) -> KernelRule | None:
    """The rule in force for `layer` on `backend` at `keras_version`; None for a backend not in the table."""
    rules = [r for r in CUDNN_RULES if r.backend == backend and r.layer == layer and r.since <= keras_version]
    return max(rules, key=lambda r: r.since) if rules else None


def _keras_version() -> tuple[int, int]:
    import keras

    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in keras.__version__.split(".")[:2])
    return major, minor


@dataclasses.dataclass(frozen=True)
class _Blocker:
    argument: str  # what was found, as constructor argument text: "recurrent_dropout=0.2"
    why: str
    replacement: str  # the argument after the fix; "" means drop it (the default is fine)


def audit_rnn_layers(model: Any, backend: str | None = None,
                     keras_version: tuple[int, int] | None = None) -> list[Finding]:
    """RNN_NO_FAST_KERNEL (listing every reason) for each LSTM/GRU that cannot use cuDNN on `backend` (default:
    the active one) at `keras_version` (default: the installed one), and RNN_MASK_RIGHT_PADDING for each one
    fed a padding mask whose kernel still runs on right-padded masks."""
    import keras

    backend = backend or keras.backend.backend()
    version = keras_version or _keras_version()
    findings: list[Finding] = []
    mask_sources = _mask_sources(model)
    for layer, where, masked in _walk(model, "", False, set()):
        cells = _lstm_gru_cells(layer.cell)
        if not cells:
            continue
        generic = not isinstance(layer, (keras.layers.LSTM, keras.layers.GRU))
        rules = {_layer_class(c): kernel_rule(backend, _layer_class(c), version) for c in cells}
        missing = [name for name, rule in rules.items() if rule is not None and not rule.kernel]
        if not generic and missing:
            findings.append(_backend_finding(layer, where, missing[0], backend, version, rules[missing[0]]))
            continue
        prefixed = len(cells) > 1
        cell_blockers = [
            b for cell in cells for b in _cell_blockers(cell, f"{cell.name}." if prefixed else "", backend)
        ]
        layer_blockers = _layer_blockers(layer)
        rule = rules[_layer_class(cells[0])]
        takes_mask = rule is None or rule.mask == "right-padded"
        if masked and not generic and not takes_mask:
            layer_blockers.append(_Blocker(
                _MASK_ARGUMENT, f"the {_BACKEND_NAMES.get(backend, backend)} backend's cuDNN path takes no mask: "
                f"{rule.source}", ""))
        if generic or cell_blockers or layer_blockers:
            findings.append(_no_kernel_finding(layer, where, cells, layer_blockers, cell_blockers, generic))
        if masked and not generic and takes_mask:
            findings.append(_mask_finding(layer, where, mask_sources))
    return findings


def while_loop_layers(model: Any, gpu: bool) -> list[str]:
    """The paths of the RNN layers that run a `tf.while_loop` in every TensorFlow step: each one with
    `unroll=False`, except, with a GPU, an LSTM/GRU that takes the cuDNN kernel (a masked one is counted as a
    loop: its kernel runs only on right-padded masks)."""
    blocked = {f.where for f in audit_rnn_layers(model, "tensorflow") if f.code == "RNN_NO_FAST_KERNEL"}
    return [where for layer, where, masked in _walk(model, "", False, set())
            if not layer.unroll and not (gpu and _lstm_gru_cells(layer.cell) and where not in blocked and not masked)]


def _backend_finding(layer: Any, where: str, layer_class: str, backend: str, version: tuple[int, int],
                     rule: KernelRule) -> Finding:
    """No cuDNN kernel for this layer class on this backend at all: name the backends that have one."""
    name = _BACKEND_NAMES.get(backend, backend)
    others = []
    for other in ("tensorflow", "torch", "jax"):
        if other == backend:
            continue
        first = min((r.since for r in CUDNN_RULES if r.backend == other and r.layer == layer_class and r.kernel),
                    default=None)
        if first is not None:
            others.append(_BACKEND_NAMES[other] + ("" if first <= (3, 0) else f" (Keras {first[0]}.{first[1]}+)"))
    message = (
        f"'{layer.name}' ({type(layer).__name__}) has no cuDNN kernel on the {name} backend in Keras "
        f"{version[0]}.{version[1]} ({rule.source}): it runs the step-by-step loop, typically several times "
        f"slower on a GPU, whatever its arguments. {' and '.join(others) or 'No other backend'} run {layer_class} "
        "on cuDNN."
    )
    advice = (f"Set `KERAS_BACKEND={'tensorflow' if backend != 'tensorflow' else 'torch'}` before importing keras"
              f" for the cuDNN {layer_class}" + (" (the JAX backend runs cuDNN LSTM from Keras 3.14)"
                                                 if backend == "jax" and layer_class == "LSTM" else "")
              + "; the layer's arguments need no change.")
    return Finding.of("RNN_NO_FAST_KERNEL", where, message, advice)


def _walk(layer: Any, path: str, masked: bool, seen: set[int]) -> Iterator[tuple[Any, str, bool]]:
    """Yield (rnn_layer, path, input_is_masked) below `layer`, depth first, each layer once."""
    import keras

    # Keras's own `Model.layers` is this call; it also reaches wrapped and custom-layer children.
    for child in layer._flatten_layers(include_self=False, recursive=False):
        if id(child) in seen:
            continue
        seen.add(id(child))
        child_path = f"{path}/{child.name}" if path else child.name
        child_masked = masked or _input_is_masked(child)
        if isinstance(child, keras.layers.RNN):
            yield child, child_path, child_masked
        else:
            # Bidirectional's halves are never called symbolically; they get exactly the wrapper's input.
            inherited = child_masked and isinstance(child, keras.layers.Bidirectional)
            yield from _walk(child, child_path, inherited, seen)


def _input_is_masked(layer: Any) -> bool:
    """Whether the layer's first input in its functional graph carries a Keras mask."""
    import keras

    try:
        inputs = layer.input
    except (AttributeError, ValueError):  # never called symbolically (subclassed model, wrapped half)
        return False
    first = keras.tree.flatten(inputs)[:1]  # an InputLayer has none
    return bool(first) and getattr(first[0], "_keras_mask", None) is not None


def _mask_sources(model: Any) -> list[str]:
    import keras

    sources = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.Masking):
            sources.append(f"'{layer.name}' (Masking)")
        elif isinstance(layer, keras.layers.Embedding) and layer.mask_zero:
            sources.append(f"'{layer.name}' (Embedding(mask_zero=True))")
    return sources


def _lstm_gru_cells(cell: Any) -> list[Any]:
    import keras

    cells = cell.cells if isinstance(cell, keras.layers.StackedRNNCells) else [cell]
    return [c for c in cells if isinstance(c, (keras.layers.LSTMCell, keras.layers.GRUCell))]


def _layer_blockers(layer: Any) -> list[_Blocker]:
    blockers = []
    if getattr(layer, "use_cudnn", "auto") is False:  # a generic RNN has no such argument
        blockers.append(_Blocker("use_cudnn=False", "cuDNN switched off explicitly", ""))
    if layer.unroll:
        blockers.append(_Blocker("unroll=True", "cuDNN runs the whole sequence in one fused kernel", ""))
    return blockers


def _cell_blockers(cell: Any, prefix: str, backend: str) -> list[_Blocker]:
    import keras

    blockers = []
    if cell.recurrent_dropout:
        rate = cell.recurrent_dropout
        replacement = f"dropout={(cell.dropout or rate)!r}"  # input dropout keeps cuDNN
        blockers.append(_Blocker(f"recurrent_dropout={rate!r}", "no recurrent dropout in cuDNN", replacement))
    if not _is_one_of(cell.activation, "tanh", backend):
        blockers.append(
            _Blocker(
                f"activation={_function_name(cell.activation)}",
                "cuDNN needs the tanh function object: 'tanh', keras.ops.tanh or tf.tanh",
                "",
            )
        )
    if not _is_one_of(cell.recurrent_activation, "sigmoid", backend):
        blockers.append(
            _Blocker(
                f"recurrent_activation={_function_name(cell.recurrent_activation)}",
                "cuDNN needs the sigmoid function object: 'sigmoid', keras.ops.sigmoid or tf.sigmoid",
                "",
            )
        )
    if not cell.use_bias:
        blockers.append(_Blocker("use_bias=False", "cuDNN kernels always add a bias", ""))
    if isinstance(cell, keras.layers.GRUCell) and not cell.reset_after:
        blockers.append(_Blocker("reset_after=False", "cuDNN implements only the reset_after=True GRU", ""))
    return [dataclasses.replace(b, argument=prefix + b.argument) for b in blockers]


def _is_one_of(function: Callable[..., Any], name: str, backend: str) -> bool:
    """Identity check against the function objects the backend's `cudnn_ok` accepts (its framework's own
    only if that framework is loaded)."""
    import keras

    accepted = [getattr(keras.activations, name), getattr(keras.ops, name)]
    own = {"tensorflow": ("tensorflow", ("tanh", "sigmoid")), "jax": ("jax.numpy", ("tanh",)),
           "torch": ("torch", ("tanh", "sigmoid"))}.get(backend)
    if own is not None and name in own[1] and sys.modules.get(own[0]) is not None:
        accepted.append(getattr(sys.modules[own[0]], name))
    return any(function is candidate for candidate in accepted)


def _function_name(function: Callable[..., Any]) -> str:
    name = getattr(function, "__name__", type(function).__name__)
    return name if name.startswith("<") else repr(name)


def _no_kernel_finding(
    layer: Any,
    where: str,
    cells: list[Any],
    layer_blockers: list[_Blocker],
    cell_blockers: list[_Blocker],
    generic: bool,
) -> Finding:
    reasons = [f"{b.argument} ({b.why})" for b in layer_blockers + cell_blockers]
    if generic:
        names = ", ".join(f"{type(c).__name__} '{c.name}'" for c in cells)
        reasons.insert(0, f"generic layers.RNN around {names} (only layers.LSTM and layers.GRU reach cuDNN)")
    message = (
        f"'{layer.name}' ({type(layer).__name__}) cannot use the cuDNN kernel: {'; '.join(reasons)}. "
        "Keras runs the step-by-step loop instead, typically several times slower on a GPU."
    )
    mask = [b for b in layer_blockers if b.argument == _MASK_ARGUMENT]
    layer_blockers = [b for b in layer_blockers if b.argument != _MASK_ARGUMENT]
    advice = ""
    if len(cells) > 1:
        advice = _stacked_advice(layer, cells, layer_blockers + cell_blockers)
    elif generic or layer_blockers or cell_blockers:
        advice = _single_advice(layer, cells[0], layer_blockers, cell_blockers, generic)
    if mask:
        advice += ("; " if advice else "") + (
            "feed it unmasked input (drop `Masking` / `mask_zero=True` and let the loss or sample weights ignore "
            "the padding), or use the TensorFlow backend, whose cuDNN kernel takes right-padded masks")
    return Finding.of("RNN_NO_FAST_KERNEL", where, message, advice)


def _single_advice(
    layer: Any, cell: Any, layer_blockers: list[_Blocker], cell_blockers: list[_Blocker], generic: bool
) -> str:
    target = _layer_class(cell)
    kept = [b.replacement for b in layer_blockers + cell_blockers if b.replacement]
    after = f"layers.{target}({_args(cell.units, kept)})"
    if generic:
        cell_call = f"layers.{type(cell).__name__}({_args(cell.units, [b.argument for b in cell_blockers])})"
        before = f"layers.RNN({_args(cell_call, [b.argument for b in layer_blockers])})"
    else:
        before = f"layers.{target}({_args(cell.units, [b.argument for b in layer_blockers + cell_blockers])})"
    return f"`{before}` → `{after}`"


def _stacked_advice(layer: Any, cells: list[Any], blockers: list[_Blocker]) -> str:
    sequences = [True] * (len(cells) - 1) + [layer.return_sequences]
    stack = ", ".join(
        f"`layers.{_layer_class(c)}({_args(c.units, ['return_sequences=True'] if seq else [])})`"
        for c, seq in zip(cells, sequences)
    )
    changes = "".join(f"; {b.argument} → {b.replacement or 'the default'}" for b in blockers)
    return f"`layers.RNN(layers.StackedRNNCells([...]))` → {stack}{changes}"


def _layer_class(cell: Any) -> str:
    import keras

    return "LSTM" if isinstance(cell, keras.layers.LSTMCell) else "GRU"


def _args(first: object, rest: list[str]) -> str:
    return ", ".join([str(first), *rest])


def _mask_finding(layer: Any, where: str, sources: list[str]) -> Finding:
    origin = f" from {', '.join(sources)}" if sources else ""
    message = (
        f"'{layer.name}' ({type(layer).__name__}) receives a padding mask{origin}. The cuDNN kernel still "
        "runs, but only for strictly right-padded sequences with no all-padding rows; Keras raises at run "
        "time on any other mask."
    )
    advice = (
        "Pad at the end: `keras.utils.pad_sequences(seqs, padding='post')`, and drop empty sequences; "
        f"if you need left padding, pass `use_cudnn=False` to '{layer.name}' (slower)."
    )
    return Finding.of("RNN_MASK_RIGHT_PADDING", where, message, advice)
