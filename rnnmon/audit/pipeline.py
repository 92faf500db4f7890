"""Static check of a training input: the tf.data stages (or Python inputs) that leave the GPU waiting.

A `tf.data.Dataset` is walked as Python objects, output to source (`_inputs()`), with the graphs of the
functions each stage runs (`_functions()`), so an in-memory `from_tensor_slices` source costs nothing to
inspect (serializing the dataset graph would copy it: about 7 s and 640 MB more for 640 MB of arrays).
Severities follow what TensorFlow will run after its default rewrites at iterator creation: a `.map`
without num_parallel_calls whose function is stateless becomes parallel (map_parallelization), and an
autotuned prefetch is appended after a synchronous last stage (inject_prefetch); tests pin both rules to
TensorFlow's own rewritten graph. Python generators and single-worker `keras.utils.PyDataset`s get
DATA_NOT_TF, a torch `DataLoader` with `num_workers=0` DATALOADER_NO_WORKERS, each explained for the backend
that reads it (TensorFlow reads a generator or a PyDataset one batch ahead on a tf.data thread; JAX and torch
call it in the training loop before each step); NumPy arrays get nothing (Keras builds a prefetched tf.data
pipeline for them). `input_kind` names the kind of input, for advice against input wait
(rnnmon.analysis.input_advice).

Example:
    >>> ds = tf.data.TFRecordDataset(files).map(parse).batch(16)
    >>> sorted(f.code for f in audit_pipeline(ds))
    ['PIPELINE_NO_CACHE', 'PIPELINE_NO_PREFETCH', 'PIPELINE_SERIAL_MAP', 'SMALL_BATCH']
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys
import types
from typing import Any

from rnnmon.findings import Finding

SMALL_BATCH_SIZE = 32
WHERE = "input pipeline"

# Stages are named by TF's class for them, less the leading underscore (map() builds a _MapDataset).
_ASYNC = {"ParallelMapDataset", "ParallelInterleaveDataset", "ParallelBatchDataset", "MapAndBatchDataset"}
_BATCH_SIZE_ATTRIBUTE = {
    "BatchDataset": "_batch_size",
    "ParallelBatchDataset": "_batch_size",
    "PaddedBatchDataset": "_batch_size",
    "MapAndBatchDataset": "_batch_size_t",
}
_READER_OPS = {  # ops that read files, found in the functions a stage runs
    "TFRecordDataset",
    "TFRecordDatasetV2",
    "TextLineDataset",
    "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2",
    "MatchingFiles",
    "ReadFile",
}
_PY_OPS = {"PyFunc", "EagerPyFunc", "PyFuncStateless"}  # tf.numpy_function, tf.py_function
_GENERATOR_OP = "GeneratorDataset"  # Dataset.from_generator
_BRANCHES = {"If": ("then_branch", "else_branch"), "While": ("cond", "body")}
_FUNCTION_NAME = re.compile(r"^__inference_Dataset_(?:flat_map|interleave|filter|map)_(.+)_\d+$")


def input_kind(data: Any) -> str | None:
    """`data`'s kind among rnnmon.analysis.input_advice.INPUT_KINDS, or None (arrays, anything else)."""
    keras = sys.modules.get("keras")
    if _tf_dataset(data) is not None:
        return "tf.data"
    if _torch_loader(data):
        return "DataLoader"
    if keras is not None and isinstance(data, keras.utils.PyDataset):
        return "PyDataset"
    return "generator" if isinstance(data, types.GeneratorType) else None


def audit_pipeline(data: Any, batch_size: int | None = None, backend: str | None = None) -> list[Finding]:
    """Findings for the training input `data`.

    `data` may be a `tf.data.Dataset`, a `tf.distribute` distributed dataset (its original dataset is
    read), a Python generator, a `keras.utils.PyDataset`, a torch `DataLoader` or anything else (NumPy
    arrays: no finding). `batch_size` is the batch size where the input shows none (arrays, generators,
    PyDataset); a batch stage in a dataset takes precedence. `backend` is the Keras backend that reads it
    (defaults to Keras's).
    """
    backend = backend or _keras_backend()
    findings: list[Finding] = []
    dataset = _tf_dataset(data)
    if dataset is not None:
        pipeline = _Pipeline.of(dataset)
        findings += _prefetch(pipeline)
        findings += _serial_stages(pipeline)
        findings += _python_stages(pipeline)
        findings += _uncached_reads(pipeline)
        batch_size = pipeline.batch_size() or batch_size
    elif isinstance(data, types.GeneratorType):  # Keras's own test for a generator input
        findings.append(_generator_input(data, backend))
    elif _is_serial_py_dataset(data):
        findings.append(_py_dataset_input(data, backend))
    elif _torch_loader(data) and data.num_workers == 0:
        findings.append(_loader_without_workers(data, backend))
    if batch_size is not None and batch_size < SMALL_BATCH_SIZE:
        findings.append(_small_batch(batch_size))
    return findings


def _tf_dataset(data: Any) -> Any:
    """The `tf.data.Dataset` behind `data`, or None; TensorFlow is only looked at if already imported."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    data = getattr(data, "_original_dataset", data)  # tf.distribute's DistributedDataset
    return data if isinstance(data, tf.data.Dataset) else None


def _torch_loader(data: Any) -> bool:
    """Whether `data` is a torch `DataLoader`; torch is only looked at if already imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(data, torch.utils.data.DataLoader)


def _keras_backend() -> str | None:
    keras = sys.modules.get("keras")
    return keras.backend.backend() if keras is not None else None


def _is_serial_py_dataset(data: Any) -> bool:
    keras = sys.modules.get("keras")
    if keras is None or not isinstance(data, keras.utils.PyDataset):
        return False
    # Keras starts background loaders only for this; otherwise batches come one at a time from __getitem__.
    return not (data.workers > 1 or (data.workers > 0 and data.use_multiprocessing))


@dataclasses.dataclass(frozen=True)
class _Stage:
    dataset: Any
    kind: str
    where: str
    upstream: frozenset[int]  # id() of every dataset this one reads from, directly or not
    functions: list[Any]  # concrete functions it runs: map/interleave/flat_map functions, generator callbacks
    ops_inside: frozenset[str]  # op types in those functions, nested functions included

    @classmethod
    def of(cls, dataset: Any, position: int, upstream: frozenset[int]) -> _Stage:
        kind = type(dataset).__name__.lstrip("_")
        functions = [wrapper.function for wrapper in dataset._functions()]
        ops: set[str] = set()
        for function in functions:
            graph_def = function.graph.as_graph_def()
            ops.update(node.op for node in graph_def.node)
            ops.update(node.op for f in graph_def.library.function for node in f.node_def)
        return cls(dataset, kind, f"{WHERE}/{kind}[{position}]", upstream, functions, frozenset(ops))

    def defined_at(self) -> str:
        """" (defined at file.py:12)" for the Python function the stage was built from, where Python can tell."""
        wrappers = self.dataset._functions()
        return _defined_at(getattr(wrappers[0], "_func", None)) if wrappers else ""

    def function_label(self) -> str:
        """The user function's name, as TF put it in the traced function's; "fn" for a class or a method."""
        name = self.functions[0].name
        match = _FUNCTION_NAME.match(name.decode() if isinstance(name, bytes) else name)
        return match.group(1) if match and match.group(1).isidentifier() else "fn"


@dataclasses.dataclass(frozen=True)
class _Pipeline:
    stages: list[_Stage]  # every input before the stage that reads it
    options: Any

    @classmethod
    def of(cls, dataset: Any) -> _Pipeline:
        order, upstream = _walk(dataset)
        stages = [_Stage.of(node, position, upstream[id(node)]) for position, node in enumerate(order, 1)]
        return cls(stages, dataset.options())

    def last(self) -> _Stage:
        """The stage that produces the elements, past with_options()."""
        by_id = {id(stage.dataset): stage for stage in self.stages}
        stage = self.stages[-1]
        while stage.kind == "OptionsDataset":
            stage = by_id[id(stage.dataset._inputs()[0])]
        return stage

    def batch_size(self) -> int | None:
        """The batch size of the batch stage nearest the output, on the main line."""
        node = self.stages[-1].dataset
        while (attribute := _BATCH_SIZE_ATTRIBUTE.get(type(node).__name__.lstrip("_"))) is None:
            inputs = node._inputs()
            if not inputs:
                return None
            node = inputs[0]
        return int(getattr(node, attribute))

    def rewrite_enabled(self, name: str) -> bool:
        """Whether a default-on tf.data graph rewrite runs; all but map_and_batch_fusion need autotune."""
        optimization = self.options.experimental_optimization
        chosen = getattr(optimization, name)
        enabled = chosen if chosen is not None else optimization.apply_default_optimizations is not False
        return enabled and (name == "map_and_batch_fusion" or self.options.autotune.enabled is not False)

    def runs_ahead(self, stage: _Stage) -> bool:
        """Whether the stage, as TensorFlow will run it, works ahead on its own threads."""
        if stage.kind in _ASYNC:
            return True
        if stage.kind == "MapDataset":
            return _auto_parallelized(stage, self)
        if stage.kind != "BatchDataset" or not self.rewrite_enabled("map_and_batch_fusion"):
            return False
        source = type(stage.dataset._inputs()[0]).__name__.lstrip("_")
        return source in ("MapDataset", "ParallelMapDataset")  # fused into a MapAndBatchDataset


def _walk(dataset: Any) -> tuple[list[Any], dict[int, frozenset[int]]]:
    """Every dataset `dataset` reads from, itself last, each after its inputs; and the id()s upstream of each."""
    upstream: dict[int, frozenset[int]] = {}
    order: list[Any] = []

    def visit(node: Any) -> frozenset[int]:
        if id(node) not in upstream:
            inputs = node._inputs()
            upstream[id(node)] = frozenset().union(*(visit(i) | {id(i)} for i in inputs))
            order.append(node)
        return upstream[id(node)]

    visit(dataset)
    return order, upstream


def cache_stage(data: Any) -> str | None:
    """Where the training input `data` caches (`input pipeline/CacheDataset[4]`, the nearest the output), or None.

    Only the datasets are walked, not the functions they run: cheap enough for every fit, audit or not.
    """
    dataset = _tf_dataset(data)
    if dataset is None:
        return None
    order, _ = _walk(dataset)
    cached = [position for position, node in enumerate(order, 1) if type(node).__name__.lstrip("_") == "CacheDataset"]
    return f"{WHERE}/CacheDataset[{cached[-1]}]" if cached else None


def batching_stage(data: Any) -> str | None:
    """How the training input `data` shapes its batches' lengths, nearest the output: "bucket_by_sequence_length"
    (a group_by_window stage: what it builds), "padded_batch", or None (not tf.data, or neither). The recompile
    advice reads it, so that a fix already made is not advised again."""
    dataset = _tf_dataset(data)
    if dataset is None:
        return None
    names = {"GroupByWindowDataset": "bucket_by_sequence_length", "PaddedBatchDataset": "padded_batch"}
    order, _ = _walk(dataset)
    for node in reversed(order):
        name = names.get(type(node).__name__.lstrip("_"))
        if name:
            return name
    return None


def _prefetch(pipeline: _Pipeline) -> list[Finding]:
    last = pipeline.last()
    if last.kind == "PrefetchDataset":
        return []
    advice = "End the pipeline with `.prefetch(tf.data.AUTOTUNE)`."
    if pipeline.runs_ahead(last):
        message = (
            f"The pipeline ends with {last.kind}, not a prefetch. As TensorFlow runs it, that stage works "
            "ahead on its own threads into a small buffer (so no prefetch is injected); an explicit "
            "prefetch decouples the next batches from the training step."
        )
        return [Finding.of("PIPELINE_NO_PREFETCH", last.where, message, advice, severity="info")]
    if pipeline.rewrite_enabled("inject_prefetch"):
        message = (
            f"The pipeline ends with {last.kind}, not a prefetch. TensorFlow appends an autotuned prefetch "
            "there at iterator creation (tf.data.Options().experimental_optimization.inject_prefetch), so "
            "input already overlaps training; an explicit one keeps that if the options change."
        )
        return [Finding.of("PIPELINE_NO_PREFETCH", last.where, message, advice, severity="info")]
    message = (
        f"The pipeline ends with {last.kind} and nothing prefetches: tf.data.Options turn inject_prefetch "
        "off (or autotune, or the default optimizations), so every batch is produced only when the training "
        "step asks for it."
    )
    return [Finding.of("PIPELINE_NO_PREFETCH", last.where, message, advice)]


def _serial_stages(pipeline: _Pipeline) -> list[Finding]:
    findings = []
    for stage in pipeline.stages:
        if stage.kind not in ("MapDataset", "InterleaveDataset"):
            continue
        method = "map" if stage.kind == "MapDataset" else "interleave"
        call = f".{method}({stage.function_label()})"
        advice = f"`{call}` → `.{method}({stage.function_label()}, num_parallel_calls=tf.data.AUTOTUNE)`"
        if method == "map" and _auto_parallelized(stage, pipeline):
            severity = "info"
            why = (
                "TensorFlow parallelizes it anyway as its function is stateless (map_parallelization); "
                "say so explicitly to keep it parallel if the function or the tf.data options change."
            )
        elif method == "map":
            severity = "warning"
            why = (
                "it runs on one thread, and TensorFlow does not parallelize it itself (a stateful function, "
                "synchronous=True, or map_parallelization or autotune off in tf.data.Options)."
            )
        else:
            severity = "warning"
            why = "it runs on one thread, and TensorFlow never parallelizes an interleave itself."
        message = f"{call}{stage.defined_at()} ({stage.kind}) has no num_parallel_calls; {why}"
        findings.append(Finding.of("PIPELINE_SERIAL_MAP", stage.where, message, advice, severity=severity))
    return findings


def _auto_parallelized(stage: _Stage, pipeline: _Pipeline) -> bool:
    """grappler's map_parallelization: a MapDataset with a stateless function becomes ParallelMapDatasetV2."""
    if stage.dataset._force_synchronous or not pipeline.rewrite_enabled("map_parallelization"):
        return False
    function = stage.functions[0]
    library = {f.signature.name: f for f in function.graph.as_graph_def().library.function}
    return not _is_stateful(function.function_def, library)


def _is_stateful(function_def: Any, library: dict[str, Any]) -> bool:
    """grappler's function_utils::IsFunctionStateful with skip_assert, as map_parallelization calls it."""
    if not function_def.signature.is_stateful:
        return False
    return any(_node_is_stateful(node, library) for node in function_def.node_def)


def _node_is_stateful(node: Any, library: dict[str, Any]) -> bool:
    from tensorflow.python.framework import op_def_registry  # the registry grappler looks ops up in

    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return True
    if not op_def.is_stateful or node.op == "Assert":
        return False
    branches = [library.get(node.attr[name].func.name) for name in _BRANCHES.get(node.op, ())]
    return not (branches and all(f is not None and not _is_stateful(f, library) for f in branches))


def _python_stages(pipeline: _Pipeline) -> list[Finding]:
    findings = []
    for stage in pipeline.stages:
        inside = stage.ops_inside
        parallel = stage.kind in _ASYNC
        severity = "info" if parallel else "warning"
        if _GENERATOR_OP in inside:
            message = (
                f"{stage.kind} runs a Python generator (Dataset.from_generator, op {_GENERATOR_OP}): Python "
                "code holding the GIL produces every element"
                + (", even with parallel calls." if parallel else ", on one thread.")
            )
            advice = (
                "Precompute into arrays (`tf.data.Dataset.from_tensor_slices`) or TFRecord files and read "
                "them with tf.data; at least shard the generator: `tf.data.Dataset.range(n).interleave("
                "lambda i: tf.data.Dataset.from_generator(gen, args=(i,), output_signature=...), "
                "num_parallel_calls=tf.data.AUTOTUNE)`."
            )
        elif found := sorted(inside & _PY_OPS):
            label = stage.function_label()
            message = (
                f"{stage.kind}({label}){stage.defined_at()} calls Python through {', '.join(found)} (tf.py_function / "
                "tf.numpy_function): it holds the GIL"
                + (", even with parallel calls." if parallel else ", and TensorFlow never parallelizes it.")
            )
            advice = (
                f"Rewrite `{label}` with TensorFlow ops (tf.strings, tf.io, tf.image, tf.math) or precompute "
                "its result; at least run it with `num_parallel_calls=tf.data.AUTOTUNE`."
            )
        else:
            continue
        findings.append(Finding.of("PIPELINE_PY_FUNCTION", stage.where, message, advice, severity=severity))
    return findings


def _uncached_reads(pipeline: _Pipeline) -> list[Finding]:
    import tensorflow as tf

    readers = (tf.data.TFRecordDataset, tf.data.TextLineDataset, tf.data.FixedLengthRecordDataset)
    cached = set().union(
        *(stage.upstream | {id(stage.dataset)} for stage in pipeline.stages if stage.kind == "CacheDataset")
    )
    for stage in pipeline.stages:
        reads = sorted(stage.ops_inside & _READER_OPS)
        if isinstance(stage.dataset, readers):
            reads.insert(0, f"tf.data.{stage.kind.removesuffix('V2')}")
        if reads and id(stage.dataset) not in cached:
            message = (
                f"{stage.kind} reads files ({', '.join(reads)}) and no .cache() follows, so every epoch "
                "reads and decodes them again."
            )
            advice = (
                "If the decoded data fits in memory, add `.cache()` after the parse/decode `.map` and "
                "before shuffle and augmentation: `ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)"
                ".cache().shuffle(...)`; otherwise `.cache('/local/disk/file')`."
            )
            return [Finding.of("PIPELINE_NO_CACHE", stage.where, message, advice)]
    return []


def _defined_at(function: Any) -> str:
    """" (defined at file.py:12)" for a Python function, class or generator; "" where Python cannot tell."""
    function = inspect.unwrap(function) if callable(function) else function
    code = getattr(function, "__code__", None) or getattr(function, "gi_code", None)
    if code is not None:
        return f" (defined at {_location(code.co_filename, code.co_firstlineno)})"
    try:
        _, line = inspect.getsourcelines(function)
        return f" (defined at {_location(inspect.getsourcefile(function) or '?', line)})"
    except (OSError, TypeError):
        return ""


def _location(filename: str, line: int) -> str:
    """`file.py:12`; for code from a Jupyter cell (compiled as `<digits>.py`), `Cell In[3], line 5`, as IPython's
    tracebacks name it (its compiler maps the file name to the cell's execution count)."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        named = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # an IPython without format_code_name (before 8.0), or a shell unlike IPython's
        named = None
    if named:
        label, name = named
        return f"{label} {name}, line {line}"
    return f"{os.path.basename(filename)}:{line}"


def _generator_input(data: types.GeneratorType, backend: str | None) -> Finding:
    if backend == "tensorflow":
        how = ("Keras wraps it in Dataset.from_generator, so one Python thread, competing with the training loop "
               "for the GIL, produces every batch.")
    else:
        how = (f"{_on(backend)} Keras calls it in the training loop itself, before each step, so its Python work "
               "for every batch adds to the step: nothing is prepared ahead.")
    message = f"The training input is a Python generator ({data.__name__}){_defined_at(data)}: {how}"
    advice = (
        "Build a tf.data pipeline instead (`tf.data.Dataset.from_tensor_slices(arrays)` or TFRecords, with "
        "`.map(..., num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)`), or a "
        "`keras.utils.PyDataset` with `workers=4, use_multiprocessing=True`"
        + (", or a torch `DataLoader` with `num_workers=4`." if backend == "torch" else ".")
    )
    return Finding.of("DATA_NOT_TF", WHERE, message, advice)


def _py_dataset_input(data: Any, backend: str | None) -> Finding:
    name = type(data).__name__
    how = ("Keras calls its __getitem__ for one batch at a time on a single thread." if backend == "tensorflow" else
           f"{_on(backend)} Keras calls its __getitem__ in the training loop itself, one batch before each step: "
           "nothing is prepared ahead.")
    message = (
        f"The training input is a keras.utils.PyDataset ({name}) with workers={data.workers}, "
        f"use_multiprocessing={data.use_multiprocessing}{_defined_at(type(data))}: {how}"
    )
    owner = _init_owner(type(data))
    change = (f"Create it as `{name}(workers=4, use_multiprocessing=True)`" if owner is None else
              f"Call `super().__init__(workers=4, use_multiprocessing=True, **kwargs)` in `{owner}.__init__`")
    advice = (
        f"{change} (threads, use_multiprocessing=False, suffice if __getitem__ mostly releases the GIL), or "
        "convert it to a tf.data pipeline."
    )
    return Finding.of("DATA_NOT_TF", WHERE, message, advice)


def _loader_without_workers(data: Any, backend: str | None) -> Finding:
    collate = getattr(data, "collate_fn", None)
    custom = collate is not None and not getattr(collate, "__module__", "").startswith("torch.")
    where = _defined_at(collate).strip(" ()")
    named = f" (collate_fn={getattr(collate, '__name__', 'fn')}{', ' + where if where else ''})" if custom else ""
    how = ("Keras reads it through Dataset.from_generator: one Python thread, competing with the training loop "
           "for the GIL, does that work" if backend == "tensorflow" else
           f"{_on(backend)} Keras reads it in the training loop itself, before each step: nothing is prepared ahead")
    message = (f"The training input is a torch DataLoader with num_workers=0{named}: every batch is loaded from its "
               f"dataset and collated in the training process, and {how}.")
    advice = (
        "Load batches in worker processes: `DataLoader(..., num_workers=4, persistent_workers=True, "
        "prefetch_factor=2)` (each worker keeps `prefetch_factor` batches ready; persistent workers are not "
        "restarted every epoch), and `pin_memory=True` when training on a GPU (faster copies to it)."
    )
    return Finding.of("DATALOADER_NO_WORKERS", WHERE, message, advice)


def _on(backend: str | None) -> str:
    """"on the JAX backend", as a message names the backend that reads the input."""
    return f"on the {'JAX' if backend == 'jax' else backend} backend"


def _init_owner(cls: type) -> str | None:
    """The user's class that defines `__init__` for a PyDataset subclass; None when PyDataset's own is used."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras."):
            return None
        if "__init__" in vars(klass):
            return klass.__name__
    return None


def _small_batch(batch_size: int) -> Finding:
    message = (
        f"The batch size is {batch_size}: each step gives the GPU too little work to cover the fixed "
        "per-step cost of launching kernels and feeding input."
    )
    advice = (
        f"Use a batch size of at least {SMALL_BATCH_SIZE} (e.g. `.batch(64)` or `fit(batch_size=64)`) and "
        "scale the learning rate with it (linearly for SGD, roughly with the square root for Adam)."
    )
    return Finding.of("SMALL_BATCH", WHERE, message, advice)
