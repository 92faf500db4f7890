"""The in-memory record between the training thread and the event file.

The training thread appends one tuple per step (`add_step`) and one per closed phase (`add_phase`); nothing
else happens on the hot path. The background thread calls `flush()` every few seconds: it drains those
buffers and the sampler, finds idle gaps, writes the chunk and, once its steps span `SCALAR_WINDOW_S` (and at
a fit's end), the Scalars-tab window means, and forgets what no open gap can still need.

Example:
    >>> recorder = Recorder(writer, sampler, wall_offset_s=time.time() - time.perf_counter())
    >>> recorder.add_step((step, epoch, begin, end, wait_s, gap_s, batches))    # monotonic seconds
    >>> recorder.flush(horizon=end)
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from rnnmon.analysis.gaps import DeviceBusy, Gap, GpuGapDetector, PhaseIntervals, StepGapDetector
from rnnmon.capture.compiles import ShapeSteps, shape_list
from rnnmon.format import schema
from rnnmon.format.writer import SummaryWriter
from rnnmon.gpu.sampler import Sampler

StepRow = tuple[int, int, float, float, float, float, int]  # step, epoch, begin, end, wait_s, gap_s, batches
_KEEP_S = 1.0  # extra history kept for blaming gaps
# The Scalars tab's means span this much of the run at least: a flush's 2 s of scalars cost more bytes than its
# steps (docs/performance.md, Disk), and a chart of a long fit shows a point per minutes anyway.
SCALAR_WINDOW_S = 10.0


class Recorder:
    """Buffers steps and phases, and turns them, with the sampler's readings, into summary chunks."""

    def __init__(self, writer: SummaryWriter, sampler: Sampler | None, wall_offset_s: float, *,
                 idle_pct: float = 5.0, min_gap_s: float = 0.01,
                 on_chunk: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._writer = writer
        self._sampler = sampler
        self._offset = wall_offset_s
        self._steps: collections.deque[StepRow] = collections.deque()
        self._phases: collections.deque[tuple[int, float, float]] = collections.deque()
        self._shapes: collections.deque[tuple[int, float, Any]] = collections.deque()
        self._compiles: collections.deque[tuple[int, int, float, float, int, float, str, Any]] = collections.deque()
        self.shape_steps = ShapeSteps()  # what each input shape's steps cost (add on the training thread)
        self._intervals = PhaseIntervals()
        devices = sampler.describe() if sampler else []
        self._device_info = {d["index"]: d for d in devices}
        self._util_written: set[int] = set()  # GPUs whose utilization table (and so description) was written
        # A device without utilization (MIG without GPM) cannot show its own gaps: step phases stand in.
        measured = [d for d in devices if d.get("utilization", "nvml") in ("nvml", "gpm")]
        self._gpu_detectors = {d["index"]: GpuGapDetector(idle_pct) for d in measured}
        self._step_detector = None if measured and len(measured) == len(devices) else StepGapDetector(min_gap_s)
        self._busy = DeviceBusy(idle_pct) if len(measured) > 1 else None
        self._idle_pct = idle_pct
        self._on_chunk = on_chunk
        self._lock = threading.Lock()
        self.last_step = 0
        self._window = _ScalarWindow()
        # What fetching a ready batch costs (rnnmon.capture.fetch_floor), once the fit's first batch measured it:
        # each chunk carries it, so live readers (alerts, the exporter) count only the wait beyond it.
        self.fetch_floor_s = 0.0

    # --- training thread -------------------------------------------------------------------------------
    def add_step(self, row: StepRow) -> None:
        self._steps.append(row)

    def add_phase(self, kind: str, start: float, end: float) -> None:
        if end > start:
            self._phases.append((schema.PHASE_KINDS.index(kind), start, end))

    def add_shapes(self, step: int, begin: float, shapes: tuple) -> None:
        """The step beginning at `begin` is the first of the fit with these input shapes (rare: a few per fit)."""
        self._shapes.append((step, begin, shapes))

    def add_compile(self, step: int, batches: int, begin: float, end: float, count: int, seconds: float,
                    source: str, shapes: tuple | None) -> None:
        """The step from `begin` to `end` (of `batches` batches) compiled `count` times, by the framework's own
        signal `source` (rnnmon.capture.compiles), for `seconds` where the framework timed it (else NaN)."""
        self._compiles.append((step, batches, begin, end, count, seconds, source, shapes))

    # --- background thread (or the training thread once the background thread has stopped) ---------------
    def flush(self, horizon: float, final: bool = False) -> None:
        """Write everything buffered; gaps are closed up to `horizon` (all of them when `final`)."""
        with self._lock:
            steps = _drain(self._steps)
            phases = _drain(self._phases)
            shapes = _drain(self._shapes)
            compiles = _drain(self._compiles)
            shape_steps = self.shape_steps.drain()
            util, stats, host = self._sampler.drain() if self._sampler else ({}, {}, [])
            self._remember_intervals(steps, phases)
            gaps = self._find_gaps(util, horizon, final)
            chunk = {"steps": steps, "phases": phases, "util": util, "stats": stats, "host": host, "gaps": gaps,
                     "fetch_floor_s": self.fetch_floor_s, "compiles": compiles}
            self._write(chunk)
            if self._window.due(final):
                self._write_scalars()
            if shapes:
                self._writer.json(schema.SHAPES_TAG, [_shape_record(row, self._offset) for row in shapes])
            if compiles:
                self._writer.json(schema.COMPILES_TAG, [_compile_record(row, self._offset) for row in compiles])
            if shape_steps:
                self._writer.json(schema.SHAPE_STEPS_TAG, shape_steps)
            if self._on_chunk is not None:
                self._on_chunk(chunk)
            self._writer.flush()

    def _remember_intervals(self, steps: list[StepRow], phases: list[tuple[int, float, float]]) -> None:
        for _, _, begin, _, wait_s, gap_s, _ in steps:
            if gap_s == gap_s:  # not NaN
                self._intervals.add(begin - gap_s, begin, "host")
            if wait_s == wait_s:
                self._intervals.add(begin, begin + wait_s, "input")
        for kind, start, end in phases:
            name = schema.PHASE_KINDS[kind]
            if name in ("warmup", "profile"):  # tracing and compiling; a profiler starting or saving
                self._intervals.add_unstepped(start, end, name)
            else:
                self._intervals.add(start, end, name)

    def _find_gaps(self, util: dict[int, list[tuple[float, float]]], horizon: float,
                   final: bool) -> list[tuple[int, Gap]]:
        found: list[tuple[int, Gap]] = []
        busy = self._busy
        if busy is not None:
            for index, samples in util.items():
                busy.add(index, samples)
        for index, detector in self._gpu_detectors.items():
            gaps = detector.feed(util.get(index, []), float("inf") if final else horizon, self._intervals)
            if final:
                gaps += detector.finish(self._intervals)
            found.extend((index, busy.blame_sync(index, gap) if busy else gap) for gap in gaps)
        if self._step_detector is not None:
            gaps = (self._step_detector.finish if final else self._step_detector.feed)(self._intervals)
            found.extend((schema.STEP_DEVICE, gap) for gap in gaps)
        marks = [d.watermark for d in (*self._gpu_detectors.values(), self._step_detector) if d is not None]
        known = [m for m in marks if m is not None]
        if known:
            self._intervals.forget_before(min(known) - _KEEP_S)
            if busy is not None:
                busy.forget_before(min(known) - _KEEP_S)
        return found

    def _write(self, chunk: dict[str, Any]) -> None:
        w, offset = self._writer, self._offset
        steps = chunk["steps"]
        if steps:
            rows = np.asarray(steps, dtype=np.float64)
            rows[:, 2:4] += offset
            rows[:, 4:6] *= 1e3
            w.table(schema.STEPS_TAG, rows)
            self.last_step = int(rows[-1, 0])
            self._window.add_steps(rows)
        if chunk["phases"]:
            rows = np.asarray(chunk["phases"], dtype=np.float64)
            rows[:, 1:] += offset
            w.table(schema.PHASES_TAG, rows)
        for index, samples in chunk["util"].items():
            if samples:
                rows = np.asarray(samples, dtype=np.float64)
                rows[:, 0] += offset
                w.table(f"{schema.UTIL_TAG_PREFIX}{index}", rows, device=self._device_info[index])
                self._util_written.add(index)
                if steps:
                    self._window.add_util(index, rows[:, 1], self._idle_pct)
        for index, samples in chunk["stats"].items():
            if samples:
                rows = np.asarray(samples, dtype=np.float64)
                rows[:, 0] += offset
                # a GPU is described once, by its first table: its utilization's where it has one
                described = {} if index in self._util_written else {"device": self._device_info[index]}
                w.table(f"{schema.STATS_TAG_PREFIX}{index}", rows, **described)
        if chunk["host"]:
            rows = np.asarray(chunk["host"], dtype=np.float64)
            rows[:, 0] += offset
            w.table(schema.HOST_TAG, rows)
        if chunk["gaps"]:
            rows = np.asarray([(device, start + offset, end + offset, schema.GAP_CAUSES.index(cause))
                               for device, (start, end, cause) in chunk["gaps"]], dtype=np.float64)
            w.table(schema.GAPS_TAG, rows)

    def _write_scalars(self) -> None:
        """The window's means, at the latest step, and a new window."""
        window, self._window = self._window, _ScalarWindow()
        w, step = self._writer, self.last_step
        w.scalar("rnnmon/step_time_ms", 1e3 * window.duration_s / window.batches, step)
        total = window.duration_s + window.gap_s
        if total > 0:
            if window.waited:
                w.scalar("rnnmon/input_wait_fraction", window.wait_s / total, step)
            w.scalar("rnnmon/host_gap_fraction", window.gap_s / total, step)
        for index, (count, util_sum, idle) in sorted(window.util.items()):
            w.scalar(f"rnnmon/gpu{index}/util_pct", util_sum / count, step)
            w.scalar(f"rnnmon/gpu{index}/idle_fraction", idle / count, step)


class _ScalarWindow:
    """Sums of the steps (and of the GPU samples of the flushes with steps) since the last Scalars-tab means."""

    def __init__(self) -> None:
        self.first = self.last = float("nan")  # the window's first begin and last end
        self.duration_s = self.gap_s = self.wait_s = 0.0
        self.batches = 0.0
        self.waited = False
        self.util: dict[int, tuple[int, float, int]] = {}  # per device: samples, their sum, idle ones

    def add_steps(self, rows: np.ndarray) -> None:
        if self.batches == 0:
            self.first = float(rows[0, 2])
        self.last = float(rows[-1, 3])
        self.duration_s += float((rows[:, 3] - rows[:, 2]).sum())
        self.gap_s += float(np.nansum(rows[:, 5]) / 1e3)
        self.wait_s += float(np.nansum(rows[:, 4]) / 1e3)
        self.waited |= bool(not np.isnan(rows[:, 4]).all())
        self.batches += float(rows[:, 6].sum())

    def add_util(self, index: int, util: np.ndarray, idle_pct: float) -> None:
        count, total, idle = self.util.get(index, (0, 0.0, 0))
        self.util[index] = (count + len(util), total + float(util.sum()), idle + int((util <= idle_pct).sum()))

    def due(self, final: bool) -> bool:
        """Whether the means are written now: the steps span the window, or the fit ends."""
        return self.batches > 0 and (final or self.last - self.first >= SCALAR_WINDOW_S)


def _shape_record(row: tuple[int, float, Any], offset: float) -> dict[str, Any]:
    step, begin, shapes = row
    return {"step": step, "time": begin + offset, "shapes": shape_list(shapes)}


def _compile_record(row: tuple[int, int, float, float, int, float, str, Any], offset: float) -> dict[str, Any]:
    step, batches, begin, end, count, seconds, source, shapes = row
    return {"step": step, "batches": batches, "time": begin + offset, "duration_s": round(end - begin, 6),
            "count": count,
            "seconds": None if seconds != seconds else round(seconds, 6), "source": source,
            "shapes": None if shapes is None else shape_list(shapes)}


def _drain(queue: collections.deque) -> list:
    return [queue.popleft() for _ in range(len(queue))]
