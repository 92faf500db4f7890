"""Reads rnnmon runs back through TensorBoard's data provider, for the plugin and for `rnnmon report`.

Example:
    >>> provider, ctx = open_logdir("runs")
    >>> runs = read_runs(provider, ctx)
    >>> runs["exp1/rnnmon"].steps[:, 0]          # global step numbers
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
from tensorboard.data import provider as tb_provider

from rnnmon import metadata as md

ALL_SAMPLES = 10**9  # `downsample` that keeps everything the provider holds


@dataclasses.dataclass
class RunData:
    """Everything rnnmon wrote for one run, as float64 tables (times in Unix seconds)."""

    run: str
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    fits: int = 0
    steps: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(md.STEP_COLUMNS))))
    phases: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(md.PHASE_COLUMNS))))
    host: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(md.HOST_COLUMNS))))
    gaps: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(md.GAP_COLUMNS))))
    util: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    stats: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    devices: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    alerts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    last_write: float = 0.0
    errors: list[str] = dataclasses.field(default_factory=list)


def open_logdir(logdir: str) -> tuple[tb_provider.DataProvider, Any]:
    """A data provider over `logdir` that keeps every rnnmon sample, and the request context it needs."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, event_accumulator, plugin_event_multiplexer

    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 1})
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    return data_provider.MultiplexerDataProvider(multiplexer, logdir), context.RequestContext()


def read_runs(provider: tb_provider.DataProvider, ctx: Any, experiment_id: str = "",
              runs: list[str] | None = None) -> dict[str, RunData]:
    """Read the named runs (default: all rnnmon runs); a run with unreadable data lists it in `errors`."""
    listing = provider.list_tensors(ctx, experiment_id=experiment_id, plugin_name=md.PLUGIN_NAME,
                                    run_tag_filter=tb_provider.RunTagFilter(runs=runs))
    data = provider.read_tensors(ctx, experiment_id=experiment_id, plugin_name=md.PLUGIN_NAME,
                                 downsample=ALL_SAMPLES, run_tag_filter=tb_provider.RunTagFilter(runs=runs))
    result = {}
    for run, tags in listing.items():
        if tags:
            result[run] = _assemble(run, tags, data.get(run, {}))
    return result


def _assemble(run: str, series: dict[str, Any], data: dict[str, list[Any]]) -> RunData:
    out = RunData(run)
    for tag, meta in series.items():
        content = md.parse_content(meta.plugin_content)
        datums = sorted(data.get(tag, []), key=lambda d: d.step)
        if datums:
            out.last_write = max(out.last_write, max(d.wall_time for d in datums))
        try:
            _store(out, tag, content, datums)
        except (ValueError, TypeError, json.JSONDecodeError) as error:
            out.errors.append(f"{tag}: {error}")
    return out


def _store(out: RunData, tag: str, content: dict[str, Any], datums: list[Any]) -> None:
    if tag == md.RUN_TAG:
        docs = [_json(d) for d in datums]
        if docs:
            out.info = docs[-1]
            out.fits = len({(doc.get("pid"), doc.get("start")) for doc in docs})
        return
    if tag == md.FINDINGS_TAG:
        out.findings = _json(datums[-1]) if datums else []
        return
    if tag == md.ALERTS_TAG:
        out.alerts = [alert for d in datums for alert in _json(d)]
        return
    columns = md.columns_for(tag)
    if columns is None:
        return  # a tag from a newer rnnmon: ignore it
    table = _table([d.numpy for d in datums], len(columns), tag)
    device = md.device_of(tag)
    if device is not None:
        out.devices[device] = content.get("device", {"index": device})
        (out.util if tag.startswith(md.UTIL_TAG_PREFIX) else out.stats)[device] = table
    else:
        setattr(out, {md.STEPS_TAG: "steps", md.PHASES_TAG: "phases", md.HOST_TAG: "host",
                      md.GAPS_TAG: "gaps"}[tag], table)


def _table(chunks: list[np.ndarray], width: int, tag: str) -> np.ndarray:
    for chunk in chunks:
        if chunk.ndim != 2 or chunk.shape[1] != width:
            raise ValueError(f"expected rows of {width} columns, found shape {chunk.shape} in {tag}")
    if not chunks:
        return np.empty((0, width))
    return np.concatenate([np.asarray(c, dtype=np.float64) for c in chunks])


def _json(datum: Any) -> Any:
    value = datum.numpy
    raw = value.item() if hasattr(value, "item") else value
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)
