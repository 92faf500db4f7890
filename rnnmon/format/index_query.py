"""Querying a run's reading index: `RunIndex` holds each event file's `FileIndex` (`rnnmon.format.index_read`)
and answers windows: the chunks a short window reads, the pyramid records a long one draws.

Example:
    >>> index = RunIndex("runs/exp1/rnnmon")       # one FileIndex per event file
    >>> index.refresh()                            # new index records and new event bytes only
    >>> index.records("steps", lo, hi, wanted=1700)   # pyramid records of a window, and the rows after them
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np

from rnnmon.format.eventfile import EVENT_FILE_MARK
from rnnmon.format.index import FAN, dir_name, intact
from rnnmon.format.index_build import build_index
from rnnmon.format.index_located import devices_in
from rnnmon.format.index_read import FileIndex, bisect_field


class RunIndex:
    """The indexes of every event file of one run folder, and the GPUs they describe."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.files: dict[str, FileIndex] = {}
        self.devices: dict[int, dict[str, Any]] = {}
        self._described: set[str] = set()  # files whose GPUs are known (none until a GPU series is seen)
        self._unlisted: str | None = None

    def refresh(self) -> None:
        try:
            names = sorted(n for n in os.listdir(self.run_dir) if EVENT_FILE_MARK in n)
            self._unlisted = None
        except OSError as error:
            self._unlisted = f"cannot list {self.run_dir}: {error.strerror or error}"
            return
        for name in names:
            index = self.files.get(name)
            if index is None:
                build_index(os.path.join(self.run_dir, name))  # a file without an index gets one, once
                index = self.files[name] = FileIndex(os.path.join(self.run_dir, name))
            index.refresh()
            if name not in self._described and _draws_gpus(index):  # a file without GPUs: its head is not read
                found = devices_in(index.path)
                for device, described in found.items():
                    self.devices.setdefault(device, described)
                if found:
                    self._described.add(name)

    @property
    def notes(self) -> list[str]:
        return [note for index in self.files.values() for note in index.notes]

    @property
    def errors(self) -> list[str]:
        found = [error for index in self.files.values() for error in index.errors]
        return [self._unlisted, *found] if self._unlisted else found

    def nbytes(self) -> int:
        """Bytes held in memory (mapped index files are the page cache's, not counted)."""
        return sum(part.nbytes(memory_only=True) for index in self.files.values() for part in index.parts())

    def series(self, prefix: str) -> list[str]:
        """The series whose names start with `prefix`."""
        found: set[str] = set()
        for index in self.files.values():
            for part in index.parts():
                found |= {n[4:] for n in part.arrays if n.startswith("dir." + prefix)}
                found |= {n for n in part.rest_series() - found if n.startswith(prefix) and len(part.rest_of(n)[0])}
        return sorted(found)

    def extent(self) -> tuple[float, float]:
        """(first, last) Unix time of anything drawn but SM activity, from each directory's first and last chunk
        and the rows not in a record yet."""
        firsts, lasts = [], []
        for index in self.files.values():
            for part in index.parts():
                for name, array in part.arrays.items():
                    if name.startswith("dir.") and not name.startswith("dir.sm") and len(array):
                        firsts.append(float(array[0]["t_first"]))
                        lasts.append(float(array[-1]["t_last"]))
        return (min(firsts), max(lasts)) if firsts else (0.0, 0.0)

    def chunks(self, series: str, lo: float, hi: float, limit: int) -> tuple[int, list[tuple[FileIndex, Any]]]:
        """Rows of `series` in chunks overlapping [lo, hi], and those chunks, when at most `limit` chunks."""
        count = rows = 0
        found: list[tuple[FileIndex, Any]] = []
        for index in self.files.values():
            for part in index.parts():
                directory = part.arrays.get(dir_name(series))
                if directory is None or not len(directory):
                    continue
                first = bisect_field(directory, "t_last", lo, "left")
                last = bisect_field(directory, "t_first", hi, "right")
                if last <= first:
                    continue
                count += last - first
                if count > limit:
                    return -1, []
                entries = np.array(directory[first:last])
                if not intact(entries):
                    raise index.damaged(f"{dir_name(series)}: a record's checksum fails")
                rows += int(entries["rows"].sum())
                found += [(index, entry) for entry in entries]
        return rows, found

    @staticmethod
    def read(found: list[tuple[FileIndex, Any]], tag: str) -> list[np.ndarray]:
        """The rows of `tag` in each chunk `chunks` found, in order, read and decoded together per file."""
        rows: list[np.ndarray] = []
        for index, group in itertools.groupby(found, key=lambda pair: pair[0]):
            rows += index.read([entry for _, entry in group], tag)
        return rows

    def records(self, series: str, lo: float, hi: float, wanted: int) -> tuple[list[np.ndarray], list[tuple]]:
        """Pyramid records of `series` that may overlap [lo, hi], from the coarsest level that still has about
        `wanted` records there (finer levels after its last record), and each part's rows after its last
        level-0 record."""
        records, rests = [], []
        for index in self.files.values():
            for part in index.parts():
                rest = part.rest_of(series)
                if rest is not None:
                    rests.append(rest)
                levels = part.levels(series)
                if not levels:
                    continue
                first, last = _window(levels[0], lo, hi)
                top = 0
                while top + 1 < len(levels) and (last - first) // FAN ** (top + 1) >= wanted:
                    top += 1
                start = 0
                for level in range(top, -1, -1):
                    array = levels[level]
                    first, last = _window(array, lo, hi, start)
                    if last > first:
                        chosen = np.array(array[first:last])
                        if not intact(chosen):
                            raise index.damaged(f"{series}.L{level}: a record's checksum fails")
                        records.append(chosen)
                    start = len(array) * FAN
        return records, rests


def _draws_gpus(index: FileIndex) -> bool:
    return any(name.startswith(("dir.util", "dir.sm")) for part in index.parts() for name in part.arrays)


def _window(array: np.ndarray, lo: float, hi: float, start: int = 0) -> tuple[int, int]:
    """Records [first, last) of `array[start:]` (absolute numbers) whose span may overlap [lo, hi]."""
    if start >= len(array):
        return start, start
    view = array[start:]
    first = max(0, bisect_field(view, "t_first", lo, "right") - 1)
    last = bisect_field(view, "t_first", hi, "right")
    return start + first, start + max(first, last)
