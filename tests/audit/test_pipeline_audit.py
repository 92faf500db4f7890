"""Input-pipeline audit: severities against the graph TensorFlow runs, then each code on real inputs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from rnnmon.audit.pipeline import audit_pipeline

_PLUMBING = {"OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset", "PrivateThreadPoolDataset"}
_RUNS_AHEAD = {
    "ParallelMapDatasetV2",
    "MapAndBatchDataset",
    "ParallelInterleaveDatasetV4",
    "ParallelBatchDataset",
}


def ops_as_run(dataset):
    """Dataset ops, source to output, after the rewrites every iterator applies (FinalizeDataset)."""
    variant = tf.data.experimental.to_variant(dataset)
    finalized = tf.raw_ops.FinalizeDataset(input_dataset=variant, **dataset._flat_structure)
    serialized = tf.raw_ops.DatasetToGraphV2(input_dataset=finalized, external_state_policy=1)
    graph = tf.compat.v1.GraphDef.FromString(serialized.numpy())
    return [node.op for node in graph.node if node.op.endswith("Dataset") or "DatasetV" in node.op]


def by_code(findings, code):
    return [f for f in findings if f.code == code]


def options(**settings):
    chosen = tf.data.Options()
    for name, value in settings.items():
        if name == "autotune":
            chosen.autotune.enabled = value
        else:
            setattr(chosen.experimental_optimization, name, value)
    return chosen


def stateful_add(x):
    return x + tf.random.uniform([], maxval=2, dtype=tf.int64)


def double(x):
    return x * 2


@tf.function
def nested_pure(x):
    return x * 2


@tf.function
def nested_python(x):
    return tf.py_function(lambda v: v, [x], tf.int64)


def with_assert(x):
    tf.debugging.assert_non_negative(x)
    return x


MAP_FUNCTIONS = {
    "stateless": double,
    "random op": stateful_add,
    "py_function": lambda x: tf.py_function(lambda v: v, [x], tf.int64),
    "numpy_function": lambda x: tf.numpy_function(lambda v: v, [x], tf.int64),
    "tf.print": lambda x: (tf.print(x), x)[1],
    "assert (If over Assert)": with_assert,
    "cond, stateless branches": lambda x: tf.cond(x > 1, lambda: x, lambda: x + 1),
    "cond, random branch": lambda x: tf.cond(x > 1, lambda: x, lambda: stateful_add(x)),
    "nested tf.function": lambda x: nested_pure(x),
    "nested tf.function, py_function": lambda x: nested_python(x),
    "stateless random": lambda x: x + tf.random.stateless_uniform([], [1, 2], maxval=2, dtype=tf.int64),
    "read_file": lambda x: tf.strings.length(tf.io.read_file(tf.strings.as_string(x))),
}
MAP_SETTINGS = {
    "defaults": ({}, {}),
    "map_parallelization off": ({"map_parallelization": False}, {}),
    "autotune off": ({"autotune": False}, {}),
    "default optimizations off": ({"apply_default_optimizations": False}, {}),
    "synchronous=True": ({}, {"synchronous": True}),
}


@pytest.mark.parametrize("settings", [  # the other settings in the full suite: 12 functions each, 1.1 s in all
    pytest.param(value, id=name, marks=() if name == "defaults" else pytest.mark.slow)
    for name, value in MAP_SETTINGS.items()])
@pytest.mark.parametrize("function", MAP_FUNCTIONS.values(), ids=MAP_FUNCTIONS.keys())
def test_serial_map_severity_agrees_with_tf_map_parallelization(function, settings):
    chosen, map_kwargs = settings
    dataset = tf.data.Dataset.range(4).map(function, **map_kwargs).with_options(options(**chosen))
    [finding] = by_code(audit_pipeline(dataset), "PIPELINE_SERIAL_MAP")

    parallel_as_run = "ParallelMapDatasetV2" in ops_as_run(dataset)
    assert finding.severity == ("info" if parallel_as_run else "warning")
    assert ("parallelizes it anyway" in finding.message) == parallel_as_run


PIPELINE_ENDS = {
    "source only": lambda d: d,
    "batch": lambda d: d.batch(2),
    "stateless map": lambda d: d.map(double),
    "stateful map": lambda d: d.map(stateful_add),
    "parallel map": lambda d: d.map(double, num_parallel_calls=2),
    "map, batch": lambda d: d.map(double).batch(2),
    "stateful map, batch": lambda d: d.map(stateful_add).batch(2),
    "parallel map, batch": lambda d: d.map(double, num_parallel_calls=2).batch(2),
    "map, padded_batch": lambda d: d.map(double).padded_batch(2),
    "parallel interleave": lambda d: d.interleave(tf.data.Dataset.from_tensors, num_parallel_calls=2),
    "parallel batch": lambda d: d.batch(2, num_parallel_calls=2),
    "shuffle": lambda d: d.shuffle(4),
}
PREFETCH_SETTINGS = {
    "defaults": {},
    "inject_prefetch off": {"inject_prefetch": False},
    "autotune off": {"autotune": False},
    "default optimizations off": {"apply_default_optimizations": False},
    "defaults off, inject_prefetch on": {"apply_default_optimizations": False, "inject_prefetch": True},
    "inject_prefetch and map_and_batch_fusion off": {"inject_prefetch": False, "map_and_batch_fusion": False},
}


@pytest.mark.parametrize("chosen", PREFETCH_SETTINGS.values(), ids=PREFETCH_SETTINGS.keys())
@pytest.mark.parametrize("end", PIPELINE_ENDS.values(), ids=PIPELINE_ENDS.keys())
def test_no_prefetch_severity_agrees_with_tf_rewrites(end, chosen):
    dataset = end(tf.data.Dataset.range(4)).with_options(options(**chosen))
    [finding] = by_code(audit_pipeline(dataset), "PIPELINE_NO_PREFETCH")

    last_as_run = [op for op in ops_as_run(dataset) if op not in _PLUMBING][-1]
    injected = last_as_run == "PrefetchDataset"
    assert finding.severity == ("info" if injected or last_as_run in _RUNS_AHEAD else "warning")
    assert ("appends an autotuned prefetch" in finding.message) == injected


@pytest.mark.parametrize(
    "dataset",
    [
        tf.data.Dataset.range(8).batch(64).prefetch(tf.data.AUTOTUNE),
        tf.data.Dataset.range(8).batch(64).prefetch(2).with_options(options(inject_prefetch=False)),
    ],
    ids=["prefetch", "prefetch-then-options"],
)
def test_trailing_prefetch_is_not_flagged(dataset):
    assert audit_pipeline(dataset) == []


def test_no_prefetch_names_the_last_stage():
    dataset = tf.data.Dataset.range(8).batch(64).with_options(options(inject_prefetch=False))
    [finding] = audit_pipeline(dataset)

    assert (finding.code, finding.severity) == ("PIPELINE_NO_PREFETCH", "warning")
    assert finding.where == "input pipeline/BatchDataset[2]"
    assert "ends with BatchDataset" in finding.message
    assert ".prefetch(tf.data.AUTOTUNE)" in finding.advice


def test_serial_interleave_is_a_warning_with_the_parallel_call():
    def load(x):
        return tf.data.Dataset.from_tensors(x)

    dataset = tf.data.Dataset.range(4).interleave(load).batch(64).prefetch(1)
    [finding] = audit_pipeline(dataset)

    assert (finding.code, finding.severity) == ("PIPELINE_SERIAL_MAP", "warning")
    assert finding.where == "input pipeline/InterleaveDataset[2]"
    assert finding.advice == "`.interleave(load)` → `.interleave(load, num_parallel_calls=tf.data.AUTOTUNE)`"


@pytest.mark.parametrize(
    "dataset",
    [
        tf.data.Dataset.range(4).map(stateful_add, num_parallel_calls=tf.data.AUTOTUNE),
        tf.data.Dataset.range(4).interleave(tf.data.Dataset.from_tensors, num_parallel_calls=2),
    ],
    ids=["map", "interleave"],
)
def test_parallel_calls_are_not_flagged(dataset):
    assert by_code(audit_pipeline(dataset.batch(64).prefetch(1)), "PIPELINE_SERIAL_MAP") == []


def generate():
    yield from np.arange(4, dtype="float32")


@pytest.mark.parametrize(
    ("dataset", "where", "severity", "quoted"),
    [
        (
            tf.data.Dataset.range(4).map(lambda x: tf.py_function(lambda v: v, [x], tf.int64)),
            "input pipeline/MapDataset[2]",
            "warning",
            "EagerPyFunc",
        ),
        (
            tf.data.Dataset.range(4).map(lambda x: tf.numpy_function(lambda v: v, [x], tf.int64), 4),
            "input pipeline/ParallelMapDataset[2]",
            "info",
            "PyFunc",
        ),
        (
            tf.data.Dataset.from_generator(generate, output_signature=tf.TensorSpec([], tf.float32)),
            "input pipeline/FlatMapDataset[2]",
            "warning",
            "GeneratorDataset",
        ),
    ],
    ids=["py_function", "parallel-numpy_function", "from_generator"],
)
def test_python_stages_are_flagged(dataset, where, severity, quoted):
    [finding] = by_code(audit_pipeline(dataset.batch(64).prefetch(1)), "PIPELINE_PY_FUNCTION")

    assert (finding.where, finding.severity) == (where, severity)
    assert quoted in finding.message
    assert "TensorFlow ops" in finding.advice or "from_tensor_slices" in finding.advice


def test_graph_only_map_is_not_a_python_stage():
    dataset = tf.data.Dataset.range(4).map(double).batch(64).prefetch(1)
    assert by_code(audit_pipeline(dataset), "PIPELINE_PY_FUNCTION") == []


@pytest.fixture
def files(tmp_path):
    record, text, fixed = str(tmp_path / "a.tfrecord"), str(tmp_path / "a.txt"), str(tmp_path / "a.bin")
    with tf.io.TFRecordWriter(record) as writer:
        writer.write(b"record")
    for path, content in ((text, "line\n"), (fixed, "abcd")):
        with open(path, "w") as f:
            f.write(content)
    return {"tfrecord": record, "text": text, "fixed": fixed}


READS = {
    "TFRecordDataset": (lambda f: tf.data.TFRecordDataset(f["tfrecord"]), "tf.data.TFRecordDataset"),
    "TextLineDataset": (lambda f: tf.data.TextLineDataset(f["text"]), "tf.data.TextLineDataset"),
    "FixedLengthRecordDataset": (
        lambda f: tf.data.FixedLengthRecordDataset(f["fixed"], 2),
        "tf.data.FixedLengthRecordDataset",
    ),
    "interleave over files": (
        lambda f: tf.data.Dataset.from_tensor_slices([f["tfrecord"]]).interleave(
            tf.data.TFRecordDataset, num_parallel_calls=2
        ),
        "TFRecordDataset",
    ),
    "map(read_file)": (
        lambda f: tf.data.Dataset.from_tensor_slices([f["text"]]).map(tf.io.read_file, num_parallel_calls=2),
        "ReadFile",
    ),
    "cache before the read": (
        lambda f: tf.data.Dataset.from_tensor_slices([f["text"]]).cache().map(tf.io.read_file, 2),
        "ReadFile",
    ),
}


@pytest.mark.parametrize(("build", "quoted"), READS.values(), ids=READS.keys())
def test_file_reads_without_cache_are_flagged(files, build, quoted):
    [finding] = by_code(audit_pipeline(build(files).batch(64).prefetch(1)), "PIPELINE_NO_CACHE")

    assert finding.severity == "info"
    assert quoted in finding.message
    assert ".cache()" in finding.advice


@pytest.mark.parametrize(
    "build",
    [
        lambda f: tf.data.TFRecordDataset(f["tfrecord"]).map(tf.strings.length, 2).cache(),
        lambda f: tf.data.Dataset.from_tensor_slices([f["text"]]).map(tf.io.read_file, 2).cache().shuffle(2),
        lambda f: tf.data.Dataset.from_tensor_slices(np.zeros((8, 3), "float32")),
    ],
    ids=["cached-tfrecord", "cached-read_file", "in-memory"],
)
def test_cached_or_in_memory_data_is_not_flagged(files, build):
    assert by_code(audit_pipeline(build(files).batch(64).prefetch(1)), "PIPELINE_NO_CACHE") == []


@pytest.mark.parametrize(
    ("data", "batch_size", "expected"),
    [
        (tf.data.Dataset.range(64).batch(16).prefetch(1), None, 16),
        (tf.data.Dataset.range(64).padded_batch(8).prefetch(1), None, 8),
        (tf.data.Dataset.range(64).batch(4, num_parallel_calls=2).prefetch(1), None, 4),
        (tf.data.Dataset.range(64).batch(64).prefetch(1), 8, None),  # the dataset's own batch wins
        (tf.data.Dataset.range(64).batch(32).unbatch().batch(8).prefetch(1), None, 8),
        (np.zeros((64, 3), "float32"), 16, 16),
        (np.zeros((64, 3), "float32"), 32, None),
        (np.zeros((64, 3), "float32"), None, None),
    ],
    ids=["batch-16", "padded-8", "parallel-4", "batch-64", "rebatched-8", "arrays-16", "arrays-32", "arrays"],
)
def test_small_batch(data, batch_size, expected):
    findings = by_code(audit_pipeline(data, batch_size=batch_size), "SMALL_BATCH")

    assert [f.severity for f in findings] == (["warning"] if expected else [])
    if expected:
        assert f"batch size is {expected}" in findings[0].message
        assert "learning rate" in findings[0].advice


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        return np.zeros((4, 3), "float32"), np.zeros((4,), "float32")


@pytest.mark.parametrize(
    ("data", "quoted"),
    [
        ((np.zeros((4, 3)) for _ in range(2)), "Python generator (<genexpr>)"),
        (Batches(), "PyDataset (Batches) with workers=1, use_multiprocessing=False"),
        (Batches(workers=0, use_multiprocessing=True), "workers=0"),
    ],
    ids=["generator", "py-dataset-default", "py-dataset-no-workers"],
)
def test_python_inputs_are_not_tf_data(data, quoted):
    [finding] = audit_pipeline(data)

    assert (finding.code, finding.severity) == ("DATA_NOT_TF", "warning")
    assert quoted in finding.message
    assert "tf.data" in finding.advice and "workers" in finding.advice


@pytest.mark.parametrize(
    "data",
    [
        Batches(workers=4),
        Batches(workers=1, use_multiprocessing=True),
        np.zeros((4, 3), "float32"),
        None,
    ],
    ids=["py-dataset-threads", "py-dataset-one-process", "arrays", "none"],
)
def test_parallel_or_array_inputs_are_fine(data):
    assert audit_pipeline(data) == []


def test_distributed_dataset_is_read_through():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    distributed = strategy.experimental_distribute_dataset(tf.data.Dataset.range(64).batch(8))
    assert {f.code for f in audit_pipeline(distributed)} == {"PIPELINE_NO_PREFETCH", "SMALL_BATCH"}
