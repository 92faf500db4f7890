"""rnnmon's summary format: plugin name, tags, column layouts, and the `SummaryMetadata` that carries them.

Every rnnmon table is a packed chunk (`rnnmon.format.packing`, versions 2 and 3) or float64 of shape
[rows, columns] (version 1), and every document a JSON string, tagged below, with
`plugin_data.plugin_name == "rnnmon"`, `data_class == DATA_CLASS_TENSOR`, and JSON content naming its columns (and,
from version 3, their storage). The tables' series are declared once, in `rnnmon.format.series`; the column tuples
below derive from them. See docs/format.md.

Example:
    >>> meta = tensor_metadata(STEPS_TAG)
    >>> parse_content(meta.plugin_data.content)["columns"][:3]
    ['step', 'epoch', 'begin']
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from tensorboard.compat.proto import summary_pb2

from rnnmon.format import series

PLUGIN_NAME = "rnnmon"
FORMAT_VERSION = series.FORMAT_VERSION
RUN_SUBDIR = "rnnmon"  # a run is `<log_dir>/rnnmon`, or `<log_dir>/<worker>/rnnmon` for a worker of a job
TASK_TYPES = ("chief", "master", "worker", "ps", "evaluator")  # TF_CONFIG's task types (TensorFlow, Cloud AI)
# A worker's folder name, whole (fullmatch): one of TASK_TYPES (or JAX's `process`), a dash and its index, in ASCII
# digits without leading zeros (`\d` took `worker-١٢`, `worker-１２` and `worker-000001` for workers 12, 12 and 1).
# Only these names become folders (rnnmon.capture.workers), so a worker's run is always one the tab recognises.
WORKER_DIR = re.compile(rf"({'|'.join(TASK_TYPES)}|process)-(0|[1-9][0-9]{{0,5}})")

RUN_TAG = "rnnmon/run"  # JSON string: run description, rewritten at each fit's start and end
STEPS_TAG = series.STEPS_TAG
PHASES_TAG = series.PHASES_TAG
HOST_TAG = series.HOST_TAG
GAPS_TAG = series.GAPS_TAG
FINDINGS_TAG = "rnnmon/findings"  # JSON string: the latest list of findings
ALERTS_TAG = "rnnmon/alerts"  # JSON string: alert records, appended per chunk
SHAPES_TAG = "rnnmon/shapes"  # JSON string: the steps whose batch had an input shape new to the fit, per chunk
COMPILES_TAG = "rnnmon/compiles"  # JSON string: the steps that compiled, by the framework's own signal, per chunk
SHAPE_STEPS_TAG = "rnnmon/shape_steps"  # JSON string: per input shape, its steps and their cost, per chunk
UTIL_TAG_PREFIX = series.UTIL_PREFIX  # + NVML index
STATS_TAG_PREFIX = series.STATS_PREFIX  # + NVML index

# Each table's columns, in order: derived from the declarations in rnnmon.format.series (add a series there).
STEP_COLUMNS = series.STEPS.columns
PHASE_COLUMNS = series.PHASES.columns
PHASE_KINDS = ("eval", "epoch_end", "warmup", "profile")  # append only: a kind is stored as its index
UTIL_COLUMNS = series.UTIL.columns
STAT_COLUMNS = series.STATS.columns
HOST_COLUMNS = series.HOST.columns
GAP_COLUMNS = series.GAPS.columns
# Append only: a cause is stored as its index. sync: another GPU of the process computed; warmup: a fit's first step
# or first validation batch (tracing, compiling); epoch_end: between an epoch's last step (or its validation) and the
# next epoch's first. Runs recorded before the last two count epoch boundaries as "eval" and warm-up as no cause.
GAP_CAUSES = ("input", "host", "eval", "other", "sync", "warmup", "epoch_end")
STEP_DEVICE = -1  # the `device` of a gap derived from step phases (no GPU)


@functools.lru_cache(maxsize=256)  # asked for every chunk read (a 2,000-worker job: 30,000 times, 0.3 s unkept)
def columns_for(tag: str) -> tuple[str, ...] | None:
    """The columns this rnnmon reads and writes for `tag`, in order; None for a document or unknown tag."""
    table = series.FORMAT.table(tag)
    return None if table is None else table.columns


def table_name(tag: str) -> str:
    """`tag` as its table is named: `rnnmon/stats/gpu<N>` for every GPU's tag, other tags as they are."""
    table = series.FORMAT.table(tag)
    return f"{table.tag}<N>" if table is not None and table.per_device else tag


def device_of(tag: str) -> int | None:
    for prefix in (UTIL_TAG_PREFIX, STATS_TAG_PREFIX):
        if tag.startswith(prefix) and tag[len(prefix):].isdigit():
            return int(tag[len(prefix):])
    return None


def tensor_metadata(tag: str, fmt: series.Format = series.FORMAT, **extra: Any) -> summary_pb2.SummaryMetadata:
    """Metadata for an rnnmon tag as `fmt` writes it; `extra` (e.g. the device name) is stored in the JSON content.

    A table's content names its columns, in order, and (version 3) its packed layout id and, for a layout of one
    storage code per column, those codes: what a reader needs to decode and map a table it did not compile in.
    """
    content: dict[str, Any] = {"version": fmt.version}
    table = fmt.table(tag)
    if table is not None:
        content["columns"] = list(table.columns)
        if table.layout:
            content["layout"] = table.layout
        if table.codec == series.ROWS_CODEC:
            content["storage"] = list(table.storage)
    if tag == PHASES_TAG:
        content["kinds"] = list(PHASE_KINDS)
    if tag == GAPS_TAG:
        content["causes"] = list(GAP_CAUSES)
    content.update(extra)
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=json.dumps(content, separators=(",", ":")).encode()),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def parse_content(content: bytes) -> dict[str, Any]:
    """The JSON stored in an rnnmon tag's plugin content; `{}` when it is not readable."""
    try:
        parsed = json.loads(content.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}
