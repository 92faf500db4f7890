"""What the tab keeps per run, under one rule: an entry per run, valid while the run's version is unchanged.

A run's version changes whenever its data does (`run_version`): its event files' names, sizes and times
(`LocalRuns.version`), or, through TensorBoard's data provider, each tag's newest sample. Every cache of the tab
(the tables' timeline and summary, the live readers, the indexed timelines, the digested summaries, the run
descriptions, the jobs of /workers) is a `RunCache`:
- one entry per key, (experiment, run) or a job's (experiment, job), made on its first use;
- `current(key, version, ...)` holds the entry's lock and, where the entry holds another version, has it take in
  this one first (a reader kept in the entry reads only what was written since); one request per entry reads,
  others for it wait for its result;
- the most recently used entries are kept: at most `most` of them, and `trim` evicts the least recently used of
  several caches until the bytes their entries hold (`nbytes`) fit a budget.

Example:
    >>> cache = RunCache(most=10)
    >>> with cache.current(("", "exp1/rnnmon"), version, make=Entry, update=read) as entry:
    ...     answer = entry.summary
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

from .run_files import LocalRuns


@dataclasses.dataclass
class Kept:
    """What every entry holds besides its own data: the version it took in (None: none yet), the bytes its arrays
    hold, and the lock held while it takes in a version."""

    version: Any = dataclasses.field(default=None, kw_only=True)
    nbytes: int = dataclasses.field(default=0, kw_only=True)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, kw_only=True)


E = TypeVar("E", bound=Kept)


class RunCache(Generic[E]):
    """Entries by key, the most recently used last; read like a mapping (`in`, `[key]`, iteration)."""

    def __init__(self, most: int | None = None) -> None:
        self._entries: collections.OrderedDict[Hashable, E] = collections.OrderedDict()
        self._most = most
        self.lock = threading.Lock()  # held only to find, add or evict entries, never while one takes in a version

    def entry(self, key: Hashable, make: Callable[[], E]) -> E:
        """The entry of `key` (`make()` where there is none), now the most recently used; evicts the least recently
        used beyond `most`."""
        with self.lock:
            found = self._entries.pop(key, None) or make()
            self.put(key, found)
            return found

    def put(self, key: Hashable, entry: E) -> None:
        """Keep `entry` for `key` as the most recently used (the caller holds `lock`)."""
        self._entries.pop(key, None)
        self._entries[key] = entry
        while self._most is not None and len(self._entries) > self._most:
            self._entries.popitem(last=False)

    @contextlib.contextmanager
    def current(self, key: Hashable, version: Any, make: Callable[[], E], update: Callable[[E], None],
                wait: bool = True) -> Iterator[E]:
        """The entry of `key` at `version`, its lock held: `update(entry)` first where it holds another version (an
        exception leaves its version as it was). With `wait=False`, while another request updates an entry that
        holds some version, that version is yielded at once instead (without the lock)."""
        entry = self.entry(key, make)
        if not entry.lock.acquire(blocking=wait or entry.version is None):
            yield entry
            return
        try:
            if entry.version != version:
                update(entry)
                entry.version = version
            yield entry
        finally:
            entry.lock.release()

    def pop(self, key: Hashable) -> E | None:
        with self.lock:
            return self._entries.pop(key, None)

    def nbytes(self) -> int:
        """What the entries' arrays hold (the caller holds `lock`)."""
        return sum(entry.nbytes for entry in self._entries.values())

    def evict_oldest(self) -> None:
        """Drop the least recently used entry (the caller holds `lock`)."""
        self._entries.popitem(last=False)

    def get(self, key: Hashable) -> E | None:
        return self._entries.get(key)

    def __getitem__(self, key: Hashable) -> E:
        return self._entries[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        with self.lock:
            return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


def run_version(run_dir: str | None, tags: dict[str, Any]) -> Any:
    """What changes whenever a run's data does: its files' version (`run_dir`: a local run's folder), or the newest
    sample of each of its tags as TensorBoard's data provider lists them."""
    if run_dir is not None:
        return LocalRuns.version(run_dir)
    return sorted((tag, series.max_step, series.max_wall_time) for tag, series in tags.items())


def held_bytes(*caches: RunCache[Any]) -> int:
    """What the entries of `caches` hold, all together."""
    with contextlib.ExitStack() as stack:
        for cache in caches:
            stack.enter_context(cache.lock)
        return sum(cache.nbytes() for cache in caches)


def trim(budget: int, *caches: RunCache[Any]) -> None:
    """Evict the least recently used entries, from the first of `caches` that has any, until all of them together
    hold at most `budget` bytes; an entry that alone is over it is answered, then dropped (the budget is a bound,
    also for one run)."""
    with contextlib.ExitStack() as stack:
        for cache in caches:
            stack.enter_context(cache.lock)
        while sum(cache.nbytes() for cache in caches) > budget:
            next(cache for cache in caches if len(cache)).evict_oldest()
