"""A run's tables, read whole, and what the routes build from them (its timeline index, its summary), per version.

All runs but the large local ones (`indexed_runs`) are drawn from their tables. Each version of a run is read once
(`RunCache.current`); its tables are kept until everything the routes need is built from them, then only what
was built. A running run's reader is kept across versions in a second cache, with its newest timeline index,
which the next version extends instead of building anew while the reader only appended rows (`reordered`
unchanged): a live run's next answer costs its new chunks.

Example:
    >>> tables, live = RunCache(most=10), RunCache(most=10)
    >>> derived(tables, live, ("", run), version, reader_read, "summary")["verdict"]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any

from rnnmon.analysis.summary import summarize
from rnnmon.format.reader import RunData, RunReader

from .run_answers import RunDataError, cuts_noted, unreadable, with_words
from .run_cache import Kept, RunCache
from .timeline import TimelineIndex, array_bytes

DERIVED = ("timeline", "summary")  # what the routes build from a run's tables


@dataclasses.dataclass
class LiveRun(Kept):
    """A running run's reader, kept across versions, and its newest timeline index, which the next version
    extends while the reader only appended rows (`reordered` unchanged)."""

    reader: RunReader
    timeline: TimelineIndex | None = None
    reordered: int = 0


@dataclasses.dataclass
class RunTables(Kept):
    """One version of a run: its tables until everything in DERIVED is built from them, then only those."""

    data: RunData | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    derived: dict[str, Any] = dataclasses.field(default_factory=dict)
    live: LiveRun | None = None  # while the run is running
    base: TimelineIndex | None = None  # an index of an earlier version of these tables, to extend


def derived(tables: RunCache[RunTables], live: RunCache[LiveRun], key: Hashable, version: Any,
            read: Callable[[RunReader], RunData], name: str, needed: tuple[str, ...] = DERIVED) -> Any:
    """What `name` ("timeline": a `TimelineIndex`, "summary") is for run `key` (experiment, run) at `version`, built
    once per version; `read(reader)` gives the run's data (only what is new to the reader). The run's tables are
    dropped once everything `needed` is built. Raises `RunDataError` for an unreadable run."""
    with tables.current(key, version, RunTables, functools.partial(_take_in, live, key, read)) as entry:
        if entry.errors:
            raise RunDataError(unreadable(key[1], entry.errors))
        if name not in entry.derived:
            entry.derived[name] = _timeline(entry) if name == "timeline" else _summary(entry)
            entry.nbytes += array_bytes(entry.derived[name])
            if set(needed) <= set(entry.derived):
                entry.data = RunData(entry.data.run)  # the tables were only needed to build these
        return entry.derived[name]


def _take_in(live: RunCache[LiveRun], key: Hashable, read: Callable[[RunReader], RunData], entry: RunTables) -> None:
    """Read the run's new version into `entry`, with its live reader where it has one (new bytes or chunks only)."""
    kept = live.pop(key)
    reader = kept.reader if kept else RunReader(key[1])
    data = cuts_noted(read(reader))
    entry.derived, entry.nbytes, entry.live = {}, 0, None
    entry.base = kept.timeline if kept is not None and kept.reordered == reader.reordered else None
    if data.info.get("status") == "running":  # more chunks will come: keep what is decoded
        entry.live = LiveRun(reader, entry.base, reader.reordered)
        with live.lock:
            live.put(key, entry.live)
    entry.data, entry.errors = data, list(data.errors)


def _timeline(entry: RunTables) -> TimelineIndex:
    """The index of this version: the previous version's, extended by the new rows, where that works."""
    index = entry.base.appended(entry.data) if entry.base is not None else None
    index = index or TimelineIndex(entry.data)
    entry.base = None
    if entry.live is not None:
        entry.live.timeline = index
    return index


def _summary(entry: RunTables) -> dict[str, Any]:
    return with_words(summarize(entry.data), entry.data.run)  # idle_gaps: the longest 20
