"""The one rule of what the tab keeps per run: an entry per key, taken in once per version, the most recently used
kept within a count and a byte budget."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from rnnmon_tensorboard.run_cache import Kept, RunCache, held_bytes, trim


@dataclasses.dataclass
class Counted(Kept):
    updates: int = 0


def _count(entry: Counted) -> None:
    entry.updates += 1


def test_an_entry_takes_in_each_version_once():
    cache: RunCache[Counted] = RunCache()
    for version in (1, 1, 2, 2, 1):
        with cache.current("run", version, Counted, _count) as entry:
            pass
    assert entry.updates == 3 and entry.version == 1


def test_a_failed_update_leaves_the_version_to_take_in_again():
    cache: RunCache[Counted] = RunCache()

    def fails(entry: Counted) -> None:
        raise OSError("gone")

    with pytest.raises(OSError), cache.current("run", 1, Counted, fails):
        pass
    with cache.current("run", 1, Counted, _count) as entry:
        assert entry.updates == 1 and not entry.lock.acquire(blocking=False)  # held while in use
    assert entry.lock.acquire(blocking=False)


def test_the_most_recently_used_are_kept_within_the_count():
    cache: RunCache[Counted] = RunCache(most=2)
    for key in ("a", "b", "a", "c"):
        cache.entry(key, Counted)
    assert list(cache) == ["a", "c"]


def test_trim_evicts_the_least_recently_used_of_the_first_cache_first():
    tables: RunCache[Counted] = RunCache()
    indexes: RunCache[Counted] = RunCache()
    for cache, key in ((indexes, "x"), (tables, "a"), (tables, "b")):
        cache.entry(key, Counted).nbytes = 10
    trim(25, tables, indexes)
    assert (list(tables), list(indexes), held_bytes(tables, indexes)) == (["b"], ["x"], 20)
    trim(5, tables, indexes)
    assert (list(tables), list(indexes)) == ([], [])


def test_a_request_that_does_not_wait_gets_the_last_version_while_another_updates():
    cache: RunCache[Counted] = RunCache()
    with cache.current("run", 1, Counted, _count):
        pass
    started, release = threading.Event(), threading.Event()

    def slow(entry: Counted) -> None:
        started.set()
        release.wait(10)

    def update() -> None:
        with cache.current("run", 2, Counted, slow):
            pass

    updating = threading.Thread(target=update)
    updating.start()
    assert started.wait(10)
    with cache.current("run", 2, Counted, _count, wait=False) as entry:
        assert entry.version == 1 and entry.updates == 1
    release.set()
    updating.join(10)
    assert cache["run"].version == 2
