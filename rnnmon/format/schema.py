"""rnnmon's summary format: plugin name, tags, column layouts, and the `SummaryMetadata` that carries them.

Every rnnmon table is a packed chunk (`rnnmon.format.packing`, version 2) or float64 of shape [rows, columns]
(version 1), and every document a JSON string, tagged below, with `plugin_data.plugin_name == "rnnmon"`,
`data_class == DATA_CLASS_TENSOR`, and JSON content naming its columns. See docs/format.md.

Example:
    >>> meta = tensor_metadata(STEPS_TAG)
    >>> parse_content(meta.plugin_data.content)["columns"][:3]
    ['step', 'epoch', 'begin']
"""

from __future__ import annotations

import json
import re
from typing import Any

from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "rnnmon"
FORMAT_VERSION = 2
RUN_SUBDIR = "rnnmon"  # a run is `<log_dir>/rnnmon`, or `<log_dir>/<worker>/rnnmon` for a worker of a job
TASK_TYPES = ("chief", "master", "worker", "ps", "evaluator")  # TF_CONFIG's task types (TensorFlow, Cloud AI)
# A worker's folder name, whole (fullmatch): one of TASK_TYPES (or JAX's `process`), a dash and its index. Only these
# names become folders (rnnmon.capture.workers), so a worker's run is always one the tab recognises.
WORKER_DIR = re.compile(rf"({'|'.join(TASK_TYPES)}|process)-(\d{{1,6}})")
# A worker's run, `[job/]worker-<index>/rnnmon`, in the syntax Python and JavaScript share (the tab compiles it)
WORKER_RUN = re.compile(rf"(^|/)(?:{WORKER_DIR.pattern})/{re.escape(RUN_SUBDIR)}$")

RUN_TAG = "rnnmon/run"  # JSON string: run description, rewritten at each fit's start and end
STEPS_TAG = "rnnmon/steps"
PHASES_TAG = "rnnmon/phases"
HOST_TAG = "rnnmon/host"
GAPS_TAG = "rnnmon/gaps"
FINDINGS_TAG = "rnnmon/findings"  # JSON string: the latest list of findings
ALERTS_TAG = "rnnmon/alerts"  # JSON string: alert records, appended per chunk
SHAPES_TAG = "rnnmon/shapes"  # JSON string: the steps whose batch had an input shape new to the fit, per chunk
UTIL_TAG_PREFIX = "rnnmon/util/gpu"  # + NVML index
STATS_TAG_PREFIX = "rnnmon/stats/gpu"  # + NVML index

STEP_COLUMNS = ("step", "epoch", "begin", "end", "input_wait_ms", "host_gap_ms", "batches")
PHASE_COLUMNS = ("kind", "start", "end")
PHASE_KINDS = ("eval", "epoch_end", "warmup", "profile")  # append only: a kind is stored as its index
UTIL_COLUMNS = ("time", "util_pct")
STAT_COLUMNS = ("time", "memory_used_mib", "memory_total_mib", "power_w", "sm_clock_mhz", "temperature_c",
                "pcie_rx_mib_s", "pcie_tx_mib_s", "clocks_event_reasons", "sm_activity_pct",
                "sm_occupancy_pct", "tensor_util_pct", "dram_bw_util_pct")
HOST_COLUMNS = ("time", "cpu_pct")
GAP_COLUMNS = ("device", "start", "end", "cause")
GAP_CAUSES = ("input", "host", "eval", "other", "sync")  # sync: another GPU of the process computed
STEP_DEVICE = -1  # the `device` of a gap derived from step phases (no GPU)

_COLUMNS = {STEPS_TAG: STEP_COLUMNS, PHASES_TAG: PHASE_COLUMNS, HOST_TAG: HOST_COLUMNS, GAPS_TAG: GAP_COLUMNS}


def columns_for(tag: str) -> tuple[str, ...] | None:
    if tag.startswith(UTIL_TAG_PREFIX):
        return UTIL_COLUMNS
    if tag.startswith(STATS_TAG_PREFIX):
        return STAT_COLUMNS
    return _COLUMNS.get(tag)


def device_of(tag: str) -> int | None:
    for prefix in (UTIL_TAG_PREFIX, STATS_TAG_PREFIX):
        if tag.startswith(prefix) and tag[len(prefix):].isdigit():
            return int(tag[len(prefix):])
    return None


def tensor_metadata(tag: str, **extra: Any) -> summary_pb2.SummaryMetadata:
    """Metadata for an rnnmon tag; `extra` (e.g. the device name) is stored in the JSON content."""
    content: dict[str, Any] = {"version": FORMAT_VERSION}
    columns = columns_for(tag)
    if columns is not None:
        content["columns"] = list(columns)
    if tag == PHASES_TAG:
        content["kinds"] = list(PHASE_KINDS)
    if tag == GAPS_TAG:
        content["causes"] = list(GAP_CAUSES)
    content.update(extra)
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=json.dumps(content).encode()),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def parse_content(content: bytes) -> dict[str, Any]:
    """The JSON stored in an rnnmon tag's plugin content; `{}` when it is not readable."""
    try:
        parsed = json.loads(content.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}
