"""Every series rnnmon records, declared once: its table, name, unit, storage, source, and where it is shown.

The rest derives from these declarations: the column tuples of `rnnmon.format.schema` (`STAT_COLUMNS`, ...), the
packed layouts of `rnnmon.format.packing`, the `columns` and `storage` a writer puts in each tag's metadata, the
GPU series the tab's timeline draws, and the Prometheus metrics the exporter feeds. Adding a series is adding
one `Series` here (and producing its value where its table's rows are made); readers map columns by the names
stored with each file, so files written before and after read alike (docs/format.md, "Adding a series").

Storage codes (`packing.CODES`): "t" int32 µs from the chunk's anchor (one per packed table), "d" int32 µs after
the "t" column, "u1"/"i1" small integers, "f4"/"f2" floats, "f8" float64 (a table that is never packed, or the
steps codec's exception rows: the steps table has a codec of its own, layout 1).

Example:
    >>> STATS.columns[:3]
    ('time', 'memory_used_mib', 'memory_total_mib')
    >>> [s.name for s in STATS.series if s.drawn]
    ['sm_activity_pct']
    >>> newer = FORMAT.with_series(STATS_PREFIX, Series("fan_speed_pct", "%", "u1", "nvmlDeviceGetFanSpeed"))
"""

from __future__ import annotations

import dataclasses

STEPS_TAG = "rnnmon/steps"
PHASES_TAG = "rnnmon/phases"
HOST_TAG = "rnnmon/host"
GAPS_TAG = "rnnmon/gaps"
UTIL_PREFIX = "rnnmon/util/gpu"  # + NVML index
STATS_PREFIX = "rnnmon/stats/gpu"  # + NVML index

STEPS_CODEC, ROWS_CODEC, FLOAT64_CODEC = "steps", "rows", "float64"


@dataclasses.dataclass(frozen=True)
class Series:
    """One recorded column.

    Attributes:
        name: The column's name, with its unit as a suffix where it has one (`power_w`); the key readers map by.
        unit: "s" (Unix seconds), "ms", "%", "MiB", "W", "MHz", "°C", "MiB/s", "count", "index", "bitmask".
        storage: How a packed chunk stores it (a `packing.CODES` code; "f8" in a table that is never packed).
        source: Where the value comes from: the NVML call, the Keras hook, the analysis that derives it.
        drawn: The key under which the tab's timeline serves it per GPU ("" when the tab does not draw it).
        exported: The Prometheus metrics it feeds, as scraped (docs/prometheus.md); () when it is not exported.
    """

    name: str
    unit: str
    storage: str
    source: str
    drawn: str = ""
    exported: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Table:
    """A table of rows: one tag (or per-device tags `prefix<NVML index>`) and its series, in column order.

    `layout` is the packed layout id in each chunk's header (0: never packed); `codec` is how chunks are packed:
    ROWS_CODEC (one storage code per column), STEPS_CODEC (layout 1's durations and exception rows) or
    FLOAT64_CODEC (never packed: version 1's float64 table).
    """

    tag: str
    layout: int
    codec: str
    series: tuple[Series, ...]
    per_device: bool = False

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.series)

    @property
    def storage(self) -> tuple[str, ...]:
        return tuple(s.storage for s in self.series)

    def matches(self, tag: str) -> bool:
        return tag.startswith(self.tag) if self.per_device else tag == self.tag


@dataclasses.dataclass(frozen=True)
class Format:
    """A format version and its tables: what one writer writes and what one reader compiles in."""

    version: int
    tables: tuple[Table, ...]

    def table(self, tag: str) -> Table | None:
        """The table `tag` belongs to (a per-device tag by its prefix), or None for a document or unknown tag."""
        return next((table for table in self.tables if table.matches(tag)), None)

    def with_series(self, tag: str, *added: Series, version: int | None = None) -> Format:
        """This format with `added` appended to the table of `tag` (and, optionally, another version): a newer
        writer, as tests and docs/format.md make one."""
        tables = tuple(dataclasses.replace(t, series=t.series + added) if t.tag == tag else t for t in self.tables)
        return Format(self.version if version is None else version, tables)


_NVML = "NVML, sampled every sample_interval_s"
_PCIE = "as a rate between polls, else nvmlDeviceGetPcieThroughput"
STEPS = Table(STEPS_TAG, 1, STEPS_CODEC, (
    Series("step", "count", "f8", "the global step after this execution (Keras on_train_batch_end)"),
    Series("epoch", "count", "f8", "Keras on_epoch_begin"),
    Series("begin", "s", "f8", "the last callback's on_train_batch_begin returns", exported=("rnnmon_step_seconds",)),
    Series("end", "s", "f8", "the first callback's on_train_batch_end is called", exported=("rnnmon_step_seconds",)),
    Series("input_wait_ms", "ms", "f8", "host time blocked in next(iterator)", exported=("rnnmon_input_wait_seconds",)),
    Series("host_gap_ms", "ms", "f8", "the previous step's end to this step's begin",
           exported=("rnnmon_host_gap_seconds",)),
    Series("batches", "count", "f8", "batches in the execution (steps_per_execution)",
           exported=("rnnmon_steps_total",)),
))
PHASES = Table(PHASES_TAG, 0, FLOAT64_CODEC, (
    Series("kind", "index", "f8", "an index into schema.PHASE_KINDS"),
    Series("start", "s", "f8", "the phase's first hook"),
    Series("end", "s", "f8", "the phase's last hook"),
))
UTIL = Table(UTIL_PREFIX, 3, ROWS_CODEC, (
    Series("time", "s", "t", "NVML sample timestamp, calibrated onto the host clock"),
    Series("util_pct", "%", "u1",
           "nvmlDeviceGetSamples (the driver's buffer), else nvmlDeviceGetUtilizationRates; GPM SM activity on MIG",
           drawn="util", exported=("rnnmon_gpu_utilization_ratio", "rnnmon_gpu_busy_seconds_total",
                                  "rnnmon_gpu_sampled_seconds_total")),
), per_device=True)
STATS = Table(STATS_PREFIX, 4, ROWS_CODEC, (
    Series("time", "s", "t", "host clock at the poll"),
    Series("memory_used_mib", "MiB", "f4", f"nvmlDeviceGetMemoryInfo.used; {_NVML}"),
    Series("memory_total_mib", "MiB", "f4", f"nvmlDeviceGetMemoryInfo.total; {_NVML}"),
    Series("power_w", "W", "f4", f"nvmlDeviceGetPowerUsage; {_NVML}"),
    Series("sm_clock_mhz", "MHz", "f4", f"nvmlDeviceGetClockInfo(NVML_CLOCK_SM); {_NVML}"),
    Series("temperature_c", "°C", "f2", f"nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU); {_NVML}"),
    Series("pcie_rx_mib_s", "MiB/s", "f4", f"NVML field 198 (PCIe RX bytes) {_PCIE}"),
    Series("pcie_tx_mib_s", "MiB/s", "f4", f"NVML field 197 (PCIe TX bytes) {_PCIE}"),
    Series("clocks_event_reasons", "bitmask", "f4", f"nvmlDeviceGetCurrentClocksEventReasons; {_NVML}"),
    Series("sm_activity_pct", "%", "f2", f"GPM metric SM_UTIL (2); {_NVML}", drawn="sm_activity"),
    Series("sm_occupancy_pct", "%", "f2", f"GPM metric SM_OCCUPANCY (3); {_NVML}"),
    Series("tensor_util_pct", "%", "f2", f"GPM metric ANY_TENSOR_UTIL (5); {_NVML}"),
    Series("dram_bw_util_pct", "%", "f2", f"GPM metric DRAM_BW_UTIL (10); {_NVML}"),
), per_device=True)
HOST = Table(HOST_TAG, 5, ROWS_CODEC, (
    Series("time", "s", "t", "host clock at the poll"),
    Series("cpu_pct", "%", "f4", "this process's CPU time over the poll interval (100 = one core)"),
))
GAPS = Table(GAPS_TAG, 2, ROWS_CODEC, (
    Series("device", "index", "i1", "NVML index of the idle GPU, -1 for gaps derived from step phases"),
    Series("start", "s", "t", "the first idle sample's interval begins", exported=("rnnmon_gpu_idle_seconds_total",)),
    Series("end", "s", "d", "the last idle sample", exported=("rnnmon_gpu_idle_seconds_total",)),
    Series("cause", "index", "u1", "an index into schema.GAP_CAUSES: the step phase that overlaps the gap most",
           exported=("rnnmon_gpu_idle_seconds_total",)),
))

# 3: metadata names storage codes and layout id; 4: chunks as byte planes (b"rnm3"); 5: chunks' short header and raw
# deflate (b"rnm4", b"rnm5"), a GPU described on its first table only, metadata JSON without spaces
FORMAT_VERSION = 5
FORMAT = Format(FORMAT_VERSION, (STEPS, PHASES, UTIL, STATS, HOST, GAPS))


def drawn(table: Table) -> tuple[tuple[str, int], ...]:
    """(timeline key, column index) of each series of `table` the tab draws per GPU."""
    return tuple((s.drawn, i) for i, s in enumerate(table.series) if s.drawn)


def exported() -> dict[str, tuple[str, ...]]:
    """Each Prometheus metric fed by recorded series, and the `table.column` names that feed it."""
    metrics: dict[str, tuple[str, ...]] = {}
    for table in FORMAT.tables:
        for s in table.series:
            for metric in s.exported:
                metrics[metric] = (*metrics.get(metric, ()), f"{table.tag}.{s.name}")
    return metrics
