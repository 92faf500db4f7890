"""Large local runs, never read whole: the timeline from their reading index, the summary from their digest.

A local run with at least `index_from_bytes` in event files (~65k steps for 1 MiB) is drawn from its reading index
(`indexed_timeline`) and summarized from its documents and digest (`rnnmon.format.digest_read`). Both are kept
per run in a `RunCache` and take in only what was written since their last version: a live run's next answer
costs its new chunks. The indexes' memory counts in the tab's cache budget like every cached index.

Example:
    >>> indexed, digested = RunCache(), RunCache(most=10)
    >>> indexed_view(indexed, ("", run), run_dir, version, (None, None, 1000))["steps"]["total"]
    >>> digested_summary(digested, ("", run), run_dir, version)["verdict"]    # None: a file has no index
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

from rnnmon.analysis.summary import summarize
from rnnmon.format.digest_read import DigestReader
from rnnmon.format.eventfile import is_cut

from .indexed_timeline import IndexedTimeline
from .run_answers import RunDataError, cuts_noted, unreadable, with_words
from .run_cache import Kept, RunCache


@dataclasses.dataclass
class Indexed(Kept):
    """A run drawn from its reading index; `nbytes`: what the index holds in memory."""

    timeline: IndexedTimeline


@dataclasses.dataclass
class Digested(Kept):
    """A large run's summary from its digest, and the reader that takes in only what was written since."""

    reader: DigestReader
    summary: dict[str, Any] | None = None
    errors: list[str] = dataclasses.field(default_factory=list)


class _WithoutIndex(Exception):
    """An event file of the run has no index (and none could be built): the run is summarized from its tables."""


def is_large(version: Any, index_from_bytes: int) -> bool:
    """True for a local run (its files' `version`) drawn from its index and digest, never from its tables."""
    return sum(size for _, size, _ in version) >= index_from_bytes


def indexed_view(cache: RunCache[Indexed], key: Hashable, run_dir: str, version: Any,
                 window: tuple[float | None, float | None, int]) -> dict[str, Any]:
    """Run `key`'s (experiment, run) timeline over `window` (start, end, points) from its index, which first takes
    in what was written since its last version (one request at a time per run)."""
    run = key[1]
    with cache.current(key, version, lambda: Indexed(IndexedTimeline(run, run_dir)), _refresh) as entry:
        problems = [error for error in entry.timeline.errors if not is_cut(error)]
        answer = None if problems else entry.timeline.view(*window)
        if answer is not None:  # cuts through records: what is around them is drawn, the cut named
            answer["notes"] = [*answer["notes"], *(error for error in entry.timeline.errors if is_cut(error))]
        entry.nbytes = entry.timeline.nbytes()  # a disagreement found while viewing indexes the file in memory
    if answer is None:
        raise RunDataError(unreadable(run, problems))
    return answer


def _refresh(entry: Indexed) -> None:
    entry.timeline.refresh()
    entry.nbytes = entry.timeline.nbytes()


def digested_summary(cache: RunCache[Digested], key: Hashable, run_dir: str, version: Any) -> dict[str, Any] | None:
    """The summary of this version of run `key`'s files from its digest; None where a file has no index."""
    run = key[1]
    try:
        with cache.current(key, version, lambda: Digested(DigestReader(run_dir, run)), _digest) as entry:
            summary, problems = entry.summary, entry.errors
    except _WithoutIndex:
        return None
    if problems:
        raise RunDataError(unreadable(run, problems))
    return summary


def _digest(entry: Digested) -> None:
    data = entry.reader.read()
    if data is None:
        raise _WithoutIndex(entry.reader.run)
    data = cuts_noted(data)
    entry.errors = list(data.errors)
    entry.summary = None if data.errors else with_words(summarize(data), entry.reader.run)
