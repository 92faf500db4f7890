"""What /runs says of each run: its newest description (`rnnmon/run`), read from the run's files or the provider.

A local run's description is read through rnnmon's reader, only the bytes written since the last version and only
the records that name the description's tag, kept per run in a `RunCache`. While another request reads a run,
its last description is answered instead of waiting (waited for only when there is none yet), so a slow disk
delays one run's status, never the list.

Example:
    >>> info, problems, notes, written, size = description(cache, ("", "exp1/rnnmon"), run_dir)
    >>> info["status"]
    'running'
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Hashable
from typing import Any

from rnnmon.format import schema
from rnnmon.format.digest_read import documents_reader
from rnnmon.format.reader import RunData, RunReader

from .run_answers import cuts_noted
from .run_cache import Kept, RunCache
from .run_files import LocalRuns


@dataclasses.dataclass
class Described(Kept):
    """The reader of a local run's descriptions, and the version of its files it last read with what that gave
    (one value, replaced whole: a request that does not wait reads both of one version)."""

    reader: RunReader | None = None
    read: tuple[Any, RunData] | None = None


def description(cache: RunCache[Described], key: Hashable, run_dir: str
                ) -> tuple[dict[str, Any], list[str], list[str], float, int]:
    """Local run `key`'s (experiment, run) newest description, its errors (the description's, and damage to its
    files), its notes (event files that overlap), when its files last changed and their size."""
    version = LocalRuns.version(run_dir)
    read = functools.partial(_read, run_dir, key[1], version)
    with cache.current(key, version, Described, read, wait=False) as described:
        version, data = described.read
    data = cuts_noted(data)
    return (data.info, data.errors, data.notes, max((mtime_ns / 1e9 for _, _, mtime_ns in version), default=0.0),
            sum(size for _, size, _ in version))


def _read(run_dir: str, run: str, version: Any, described: Described) -> None:
    if described.reader is None:  # its first read: the events its index lists, then what follows
        described.reader = documents_reader(run_dir, run, frozenset({schema.RUN_TAG}))
    described.read = version, described.reader.update_from_files(run_dir)


def newest_json(datums: list[Any]) -> tuple[dict[str, Any], str | None]:
    """The newest run description among the provider's `datums`, and a message when it is not readable."""
    if not datums:
        return {}, None
    datum = max(datums, key=lambda d: d.step)
    try:
        raw = datum.numpy.item() if hasattr(datum.numpy, "item") else datum.numpy
        doc = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        return {}, f"{schema.RUN_TAG}: {error}"
    return (doc, None) if isinstance(doc, dict) else ({}, f"{schema.RUN_TAG}: not a JSON object")
