"""Idle gaps: maximal intervals in which the GPU did no work, each blamed on the step phase it overlaps most.

With a GPU, a gap is a run of utilization samples at or below the idle level (sample `i` covers the time since
sample `i-1`). Without one, a gap is a run of contiguous non-compute time (host gap, input wait, evaluation or
epoch end) of at least `min_gap_s`. Both detectors are incremental: feed them chunks in time order and they
keep the gap that is still open.

Example:
    >>> phases = PhaseIntervals()
    >>> phases.add(start=10.0, end=10.5, cause="input")
    >>> detector = GpuGapDetector(idle_pct=5.0)
    >>> detector.feed([(10.0, 90.0), (10.2, 0.0), (10.4, 0.0), (10.6, 80.0)], horizon=11.0, phases=phases)
    [(10.0, 10.4, 'input')]
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rnnmon.format.schema import GAP_CAUSES

Gap = tuple[float, float, str]  # start, end, cause
_TOUCH_S = 1e-4  # intervals closer than this are contiguous


def overlap_s(start: float, end: float, intervals: Iterable[tuple[float, float]]) -> float:
    """How much of [start, end] the (start, end) `intervals` cover, in seconds (time two of them share counts once)."""
    covered, reach = 0.0, start
    for s, e in sorted((max(s, start), min(e, end)) for s, e in intervals if e > start and s < end):
        if e > reach:
            covered += e - max(s, reach)
            reach = e
    return covered


class PhaseIntervals:
    """Known non-compute intervals (start, end, cause index), kept while gaps may still need them.

    Warm-up (tracing and compiling: a fit's first step and first validation batch) and profile phases (a profiler
    starting, or stopping and saving) are `add_unstepped`: they form no gap from step phases. In `blame` warm-up is
    a cause of its own (the GPU idles until the first step has compiled), and profile time is left out of the vote.
    """

    def __init__(self) -> None:
        self._rows = np.empty((0, 3))
        self._pending: list[tuple[float, float, int]] = []
        self._unstepped: dict[str, list[tuple[float, float]]] = {"warmup": [], "profile": []}

    def add(self, start: float, end: float, cause: str) -> None:
        if end > start:
            self._pending.append((start, end, GAP_CAUSES.index(cause)))

    def add_unstepped(self, start: float, end: float, kind: str) -> None:
        """A warm-up or profile phase."""
        self._unstepped[kind].append((start, end))

    def _table(self) -> np.ndarray:
        if self._pending:
            self._rows = np.vstack([self._rows, np.asarray(self._pending)])
            self._pending = []
        return self._rows

    def sorted_since(self, time: float) -> np.ndarray:
        rows = self._table()
        rows = rows[rows[:, 1] > time]
        return rows[np.argsort(rows[:, 0], kind="stable")]

    def blame(self, start: float, end: float) -> str:
        """The cause that overlaps [start, end] most; time no phase explains counts as "other"."""
        rows = self._table()
        overlap = np.clip(np.minimum(rows[:, 1], end) - np.maximum(rows[:, 0], start), 0, None)
        totals = np.bincount(rows[:, 2].astype(int), weights=overlap, minlength=len(GAP_CAUSES)).astype(float)
        totals[GAP_CAUSES.index("warmup")] = overlap_s(start, end, self._unstepped["warmup"])
        profile_s = overlap_s(start, end, self._unstepped["profile"])
        totals[GAP_CAUSES.index("other")] = max(0.0, (end - start) - totals.sum() - profile_s)
        return GAP_CAUSES[int(np.argmax(totals))] if totals.any() else "other"

    def forget_before(self, time: float) -> None:
        rows = self._table()
        self._rows = rows[rows[:, 1] >= time]
        self._unstepped = {kind: [w for w in spans if w[1] >= time] for kind, spans in self._unstepped.items()}


class GpuGapDetector:
    """Runs of utilization samples at or below `idle_pct`, on one device."""

    def __init__(self, idle_pct: float) -> None:
        self.idle_pct = idle_pct
        self._open_start: float | None = None
        self._open_end = 0.0
        self._last_time: float | None = None
        self._held: list[tuple[float, float]] = []

    @property
    def watermark(self) -> float | None:
        """Gaps can only still touch times after this one."""
        return self._open_start if self._open_start is not None else self._last_time

    def feed(self, samples: Iterable[tuple[float, float]], horizon: float, phases: PhaseIntervals) -> list[Gap]:
        """Take samples (time, pct) in time order; samples after `horizon` wait until phases there are known."""
        queue = sorted([*self._held, *samples])
        self._held = [s for s in queue if s[0] > horizon]
        closed: list[Gap] = []
        for time, pct in (s for s in queue if s[0] <= horizon):
            previous = self._last_time if self._last_time is not None else time
            self._last_time = time
            if pct <= self.idle_pct:
                if self._open_start is None:
                    self._open_start = previous
                self._open_end = time
            elif self._open_start is not None:
                closed.append(self._close(phases))
        return closed

    def finish(self, phases: PhaseIntervals) -> list[Gap]:
        closed = self.feed([], float("inf"), phases)
        return closed + ([self._close(phases)] if self._open_start is not None else [])

    def _close(self, phases: PhaseIntervals) -> Gap:
        start, end = self._open_start, self._open_end
        self._open_start = None
        return (start, end, phases.blame(start, end)) if end > start else (start, start, "other")


class StepGapDetector:
    """Contiguous non-compute time of at least `min_gap_s`, from step phases alone (no GPU)."""

    def __init__(self, min_gap_s: float) -> None:
        self.min_gap_s = min_gap_s
        self._open: tuple[float, float] | None = None
        self._consumed = float("-inf")

    @property
    def watermark(self) -> float | None:
        if self._open is not None:
            return self._open[0]
        return None if self._consumed == float("-inf") else self._consumed

    def feed(self, phases: PhaseIntervals) -> list[Gap]:
        closed: list[Gap] = []
        for start, end, _ in phases.sorted_since(self._consumed):
            start = max(start, self._consumed)
            if self._open is not None and start - self._open[1] <= _TOUCH_S:
                self._open = (self._open[0], max(self._open[1], end))
            else:
                closed.extend(self._close(phases))
                self._open = (start, end)
            self._consumed = max(self._consumed, end)
        return closed

    def finish(self, phases: PhaseIntervals) -> list[Gap]:
        return self.feed(phases) + self._close(phases)

    def _close(self, phases: PhaseIntervals) -> list[Gap]:
        opened, self._open = self._open, None
        if opened is None or opened[1] - opened[0] < self.min_gap_s:
            return []
        return [(opened[0], opened[1], phases.blame(*opened))]


class DeviceBusy:
    """When each GPU worked (sample `i` above `idle_pct` covers the time since sample `i-1`), for cross-GPU blame.

    A gap on one GPU during which another GPU of the process computed is a wait for that replica (the all-reduce
    of `MirroredStrategy`), not for input: `blame_sync` says so. The others are judged only on the part of the gap
    their samples reach: each GPU's timestamps are calibrated on their own, and at a fit's start and end one GPU's
    samples can begin or end a sample period before another's.

    Example:
        >>> busy = DeviceBusy(idle_pct=5.0)
        >>> busy.add(0, [(10.0, 90.0), (10.2, 90.0), (10.4, 90.0)])
        >>> busy.blame_sync(1, (10.0, 10.4, "input"))
        (10.0, 10.4, 'sync')
    """

    def __init__(self, idle_pct: float) -> None:
        self.idle_pct = idle_pct
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._busy: dict[int, list[tuple[float, float]]] = {}

    def add(self, device: int, samples: Iterable[tuple[float, float]]) -> None:
        rows = self._busy.setdefault(device, [])
        for time, pct in sorted(samples):
            previous = self._last.get(device)
            if previous is not None and time > previous and pct > self.idle_pct:
                rows.append((previous, time))
            self._first.setdefault(device, time)
            self._last[device] = max(time, previous if previous is not None else time)

    def blame_sync(self, device: int, gap: Gap) -> Gap:
        """`gap` with cause "sync" when other GPUs computed during at least half of the part of it that their
        samples reach; else unchanged."""
        start, end, _ = gap
        others = [other for other in self._busy if other != device]
        covered = overlap_s(start, end, [row for other in others for row in self._busy[other]])
        known = overlap_s(start, end, [(self._first[other], self._last[other]) for other in others])
        return (start, end, "sync") if known > 0 and covered >= 0.5 * known else gap

    def forget_before(self, time: float) -> None:
        for device, rows in self._busy.items():
            self._busy[device] = [row for row in rows if row[1] >= time]
