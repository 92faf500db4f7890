"""Alerts: rules over the recorder's chunks that fire once when a problem starts and once when it resolves.

Each rule measures one number over the trailing `for_s` seconds, like Prometheus' `for:`, so one slow step
or one idle sample does not fire it; a rule says nothing until its data reaches back a whole window. It is
judged at every sample or step: it fires when the number is strictly past the threshold (above it; below it
for utilization) and resolves only when it is back at or past the resolve value; the band between the two
keeps a noisy number from flapping. Means are time-weighted: a device sample covers the time since the one
before (as in rnnmon.analysis.gaps), a step its host gap and itself. The rules (see rnnmon.alerts.thresholds for the
fields):

- gpu_util_low: per GPU, mean utilization below `pct`.
- input_wait_high: input wait as a share of step time (step + host gap), i.e. the steps' mean share, above `pct`;
  only the wait beyond the fetch floor the chunk carries (what fetching a ready batch costs), as in the report.
- idle_gap: per GPU (run-wide without one), a gap of at least `min_s`; gaps arrive closed, so it fires and
  resolves at once, with the gap's start and end.
- step_time_high: the median step time per batch (end - begin, as in the Scalars tab), over the steps that
  end in the window, above `ms`.
- step_time_regression: that median above `ratio` times the run's baseline, the median of the first
  `baseline_steps` steps after warm-up.
- gpu_memory_high: per GPU, mean memory used above `pct` of the total.
- gpu_throttled: per GPU, the share of the time with one of the watched clock-event reasons set above `pct`.

The warm-up step of a fit (NaN host gap: tracing, iterator creation) is left out, and device samples taken
before it ended are ignored; an idle gap that is mostly a warm-up phase (the first validation batch traces
Keras's test function) or a profile phase (a profiler starting, or stopping and saving) is not an alert either.
Feed one engine per fit. Times in chunks are monotonic seconds; events carry Unix seconds (`+ wall_offset_s`).

Example:
    >>> engine = AlertEngine(Thresholds(), wall_offset_s=time.time() - time.perf_counter())
    >>> for event in engine.update(chunk):          # from Recorder(on_chunk=...), every ~2 s
    ...     print(event.state, event.message)
    >>> engine.finish(time.perf_counter())          # closes what is still firing
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

from rnnmon.alerts.thresholds import THROTTLE_REASONS, Thresholds
from rnnmon.analysis.gaps import overlap_s
from rnnmon.format.schema import PHASE_KINDS, STAT_COLUMNS, STEP_DEVICE

State = Literal["firing", "resolved"]
_MEMORY_USED = STAT_COLUMNS.index("memory_used_mib")
_MEMORY_TOTAL = STAT_COLUMNS.index("memory_total_mib")
_REASONS = STAT_COLUMNS.index("clocks_event_reasons")

_ADVICE = {  # input wait: tf.data's advice; an engine is given the advice for its fit's kind of input
    "gpu_util_low": "The GPU is waiting on the host: see the input-wait and idle-gap alerts; otherwise raise the "
                    "batch size or steps_per_execution, and keep LSTM/GRU layers on the cuDNN kernel.",
    "input_wait_high": "The input pipeline cannot keep up: add .prefetch(tf.data.AUTOTUNE) and "
                       "num_parallel_calls=tf.data.AUTOTUNE to map, and .cache() data that fits in memory.",
    "step_time_high": "If input wait is high too, fix the input pipeline first; otherwise each step does more "
                      "work than planned: check batch size, sequence length and retracing on new shapes.",
    "step_time_regression": "Steps got slower since the start: look for retracing on new shapes (pad or bucket "
                            "sequences), longer sequences later in the data, callbacks that keep growing state, "
                            "a slower input pipeline, or throttling.",
    "gpu_memory_high": "Out-of-memory is close: lower the batch size or sequence length. TensorFlow reserves "
                       "nearly all memory up front unless memory growth is on "
                       "(tf.config.experimental.set_memory_growth).",
    "gpu_throttled": "For thermal reasons check cooling, fans and airflow (nvidia-smi -q -d TEMPERATURE); for "
                     "power reasons the GPU is at its power limit (nvidia-smi -q -d POWER).",
}
_GAP_CAUSES = {  # cause (the recorded phase that overlapped the idle time most) → (where it was, advice)
    "input": ("waiting for input", _ADVICE["input_wait_high"]),
    "host": ("on host work between steps",
             "Move per-step Python work (callbacks, logging, metrics) out of the loop or raise steps_per_execution."),
    "eval": ("during validation", "Validate less often (validation_freq) or with a larger batch size."),
    "epoch_end": ("at epoch ends, between one epoch's last step and the next one's first",
                  "Look at the epoch-end callbacks (checkpoints: save less often) and at the input iterator's "
                  "restart: on TensorFlow each epoch makes a new iterator, and tearing down the last one can wait "
                  "seconds for tf.data's autotuning (seen under XLA); `.repeat()` the dataset and pass "
                  "`steps_per_epoch` to keep one iterator for the whole fit."),
    "warmup": ("during warm-up (tracing and compiling)",
               "A fit pays this once, before its first step and its first validation batch."),
    "sync": ("while another GPU computed",
             "The replicas wait for the slowest at every all-reduce: see DEVICE_IMBALANCE in the report."),
    "other": ("where no step phase was recorded",
              "Look for work the recorded phases do not show: ops placed on the CPU inside the step, or other "
              "threads and processes on this machine."),
}


@dataclasses.dataclass(frozen=True)
class AlertEvent:
    """One alert starting ("firing") or ending ("resolved"); both events of an alert share rule, device, start.

    `value` is the measured number and `threshold` the one it crossed (the resolve value when resolved), in the
    rule's unit: % for utilization, input wait, memory and throttling; s for gaps; ms for step time; × for the
    regression. Times are Unix seconds; `device` is the NVML index, or None for run-wide rules.
    """

    rule: str
    device: int | None
    state: State
    start: float
    end: float | None
    value: float
    threshold: float
    message: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Open:
    """An alert that has fired: its firing event, and its value now and at its worst."""

    start: float  # monotonic
    event: AlertEvent
    latest: float
    worst: float
    describe: Callable[[float], str]


class _Window:
    """Intervals (start, end, value), added in order of `end`, that end in the trailing `span_s` seconds."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._items: collections.deque[tuple[float, float, float]] = collections.deque()
        self._since = math.inf
        self._area = 0.0  # sum of value * length
        self._length = 0.0

    def add(self, start: float, end: float, value: float) -> bool:
        """Add an interval; True once the intervals seen reach back a whole window.

        A pause longer than the window (a long epoch end) starts it afresh: one interval after it is no
        sustained state.
        """
        if self._items and start - self._items[-1][1] > self.span_s:
            self._since = math.inf
        self._since = min(self._since, start)
        self._push(start, end, value)
        cutoff = end - self.span_s
        while self._items[0][1] <= cutoff:
            self._pop()
        return self._since <= cutoff

    def sample(self, time: float, value: float) -> bool:
        """Add a sample that covers the time since the previous one (clamped: time can go backwards)."""
        start = self._items[-1][1] if self._items else time
        return self.add(start, max(time, start), value)

    def mean(self) -> float:
        """Time-weighted mean over the window; the oldest interval counts only where it lies inside."""
        start, _, value = self._items[0]
        outside = max(0.0, self._items[-1][1] - self.span_s - start)
        length = self._length - outside
        return (self._area - value * outside) / length if length > 0 else value

    def _push(self, start: float, end: float, value: float) -> None:
        self._items.append((start, end, value))
        self._area += value * (end - start)
        self._length += end - start

    def _pop(self) -> tuple[float, float, float]:
        start, end, value = item = self._items.popleft()
        self._area -= value * (end - start)
        self._length -= end - start
        return item


class _SortedWindow(_Window):
    """A `_Window` that also keeps its values sorted, for the median of the intervals in it."""

    def __init__(self, span_s: float) -> None:
        super().__init__(span_s)
        self._sorted: list[float] = []

    def median(self) -> float:
        return _median_of_sorted(self._sorted)

    def _push(self, start: float, end: float, value: float) -> None:
        super()._push(start, end, value)
        bisect.insort(self._sorted, value)

    def _pop(self) -> tuple[float, float, float]:
        item = super()._pop()
        del self._sorted[bisect.bisect_left(self._sorted, item[2])]
        return item


class AlertEngine:
    """Turns the recorder's chunks into alert events (see the module docstring for the rules).

    Args:
        thresholds: The rules' thresholds. Defaults to `Thresholds()`.
        wall_offset_s: Added to chunk times to give the events' Unix seconds. Defaults to `0.0`.
        input_advice: What input-wait alerts and input gaps advise, for the fit's kind of input
            (rnnmon.analysis.input_advice). Defaults to `None`: tf.data's advice.

    Example:
        ```python
        engine = AlertEngine(load_thresholds_file(path) or Thresholds(), wall_offset_s=offset)
        events = engine.update(chunk)
        ```
    """

    def __init__(self, thresholds: Thresholds | None = None, *, wall_offset_s: float = 0.0,
                 input_advice: str | None = None) -> None:
        self._thresholds = t = thresholds or Thresholds()
        self.wall_offset_s = wall_offset_s
        self._advice = {**_ADVICE, **({"input_wait_high": input_advice} if input_advice else {})}
        self._open: dict[tuple[str, int | None], _Open] = {}
        self._wait_window = _Window(t.input_wait_high.for_s)
        self._step_window = _SortedWindow(t.step_time_high.for_s)
        self._regression_window = _SortedWindow(t.step_time_regression.for_s)
        self._device_windows: dict[tuple[str, int], _Window] = {}
        self._baseline: list[float] = []  # per-batch ms of the first steps, until there are enough
        self._baseline_ms: float | None = None
        self._warm_end: float | None = None  # device samples before this time are ignored
        self._warmups: list[tuple[float, float]] = []  # warm-up phases after the first, and profile phases
        self._throttle_bits: dict[int, int] = {}
        self._events: list[AlertEvent] = []
        self._floor_s = 0.0  # the fetch floor of the chunk being judged

    @property
    def thresholds(self) -> Thresholds:
        """Fixed for the engine's life: its windows are sized by them."""
        return self._thresholds

    @property
    def active(self) -> list[AlertEvent]:
        """The firing events of the alerts that have not resolved yet."""
        return [alert.event for alert in self._open.values()]

    def update(self, chunk: Mapping[str, Any]) -> list[AlertEvent]:
        """Feed one chunk (chunks in time order); returns the events it caused, oldest first."""
        self._events = []
        self._floor_s = float(chunk.get("fetch_floor_s", 0.0))
        for row in chunk.get("steps", ()):
            self._step(*row)
        if self._warm_end is not None:
            for device, samples in chunk.get("util", {}).items():
                for time, pct in samples:
                    if time >= self._warm_end and not math.isnan(pct):
                        self._utilization(device, time, pct)
            for device, rows in chunk.get("stats", {}).items():
                for row in rows:
                    if row[0] >= self._warm_end:
                        self._device_stats(device, row)
            self._warmups += [(start, end) for kind, start, end in chunk.get("phases", ())
                              if PHASE_KINDS[int(kind)] in ("warmup", "profile") and start >= self._warm_end]
            for device, (start, end, cause) in chunk.get("gaps", ()):
                if start >= self._warm_end and not self._mostly_warmup(start, end):
                    self._gap(None if device == STEP_DEVICE else device, start, end, cause)
        return sorted(self._events, key=_event_time)

    def _mostly_warmup(self, start: float, end: float) -> bool:
        return overlap_s(start, end, self._warmups) >= 0.5 * (end - start)

    def finish(self, now: float, reason: str = "Training ended") -> list[AlertEvent]:
        """Resolve every open alert at `now` (monotonic seconds), as training ends or the thresholds change."""
        self._events = []
        for (rule, device), alert in list(self._open.items()):
            self._close(rule, device, max(now, alert.start), alert, alert.event.threshold,
                        f"{reason} while firing: {alert.describe(alert.latest)}.")
        return sorted(self._events, key=_event_time)

    # --- rules -----------------------------------------------------------------------------------------
    def _step(self, step: int, epoch: int, begin: float, end: float, wait_s: float, gap_s: float,
              batches: int) -> None:
        if math.isnan(gap_s):  # the fit's warm-up step
            self._warm_end = end
            return
        if self._warm_end is None:
            self._warm_end = -math.inf
        t = self._thresholds
        total_s = end - begin + gap_s
        ms = 1e3 * (end - begin) / max(batches, 1)
        wait, high = t.input_wait_high, t.step_time_high
        if wait.enabled and not math.isnan(wait_s) and total_s > 0:
            wait_s = max(wait_s - self._floor_s * max(batches, 1), 0.0)
            window = self._wait_window
            if window.add(begin - gap_s, end, 100 * wait_s / total_s):
                self._judge(wait.RULE, None, end, window.mean(), wait.pct, wait.resolve_pct,
                            lambda v: f"Input wait took {_num(v)}% of step time over the last {_setting(wait.for_s)} s")
        if high.enabled:
            window = self._step_window
            if window.add(begin - gap_s, end, ms):
                self._judge(high.RULE, None, end, window.median(), high.ms, high.resolve_ms,
                            lambda v: f"Median step time was {_num(v)} ms over the last {_setting(high.for_s)} s")
        if t.step_time_regression.enabled:
            self._regression(begin - gap_s, end, ms)

    def _regression(self, start: float, end: float, ms: float) -> None:
        rule = self._thresholds.step_time_regression
        window = self._regression_window
        full = window.add(start, end, ms)
        if self._baseline_ms is None:
            self._baseline.append(ms)
            if len(self._baseline) == rule.baseline_steps:
                self._baseline_ms = _median_of_sorted(sorted(self._baseline))
            return
        base = self._baseline_ms
        if full and base > 0:
            self._judge(rule.RULE, None, end, window.median() / base, rule.ratio, rule.resolve_ratio,
                        lambda v: f"Median step time was {_num(v * base)} ms over the last {_setting(rule.for_s)} s, "
                                  f"{_num(v, 2)}× the baseline of {_num(base)} ms from the first "
                                  f"{rule.baseline_steps} steps")

    def _utilization(self, device: int, time: float, pct: float) -> None:
        rule = self._thresholds.gpu_util_low
        if not rule.enabled:
            return
        window = self._window(rule.RULE, device, rule.for_s)
        if window.sample(time, pct):
            self._judge(rule.RULE, device, time, window.mean(), rule.pct, rule.resolve_pct,
                        lambda v: f"GPU {device} utilization averaged {_num(v)}% over the last "
                                  f"{_setting(rule.for_s)} s",
                        high=False)

    def _device_stats(self, device: int, row: tuple[float, ...]) -> None:
        time, used, total, bits = row[0], row[_MEMORY_USED], row[_MEMORY_TOTAL], row[_REASONS]
        memory, throttled = self._thresholds.gpu_memory_high, self._thresholds.gpu_throttled
        if memory.enabled and total > 0 and not math.isnan(used):
            window = self._window(memory.RULE, device, memory.for_s)
            if window.sample(time, 100 * used / total):
                self._judge(memory.RULE, device, time, window.mean(), memory.pct, memory.resolve_pct,
                            lambda v: f"GPU {device} memory use averaged {_num(v)}% of {_num(total, 0)} MiB over "
                                      f"the last {_setting(memory.for_s)} s")
        if throttled.enabled and not math.isnan(bits):
            active = int(bits) & throttled.mask
            if active:
                self._throttle_bits[device] = active
            window = self._window(throttled.RULE, device, throttled.for_s)
            if window.sample(time, 100.0 if active else 0.0):
                self._judge(throttled.RULE, device, time, window.mean(), throttled.pct, throttled.resolve_pct,
                            lambda v: f"GPU {device} clocks were throttled {_num(v)}% of the last "
                                      f"{_setting(throttled.for_s)} s, lately by {self._reasons(device)}")

    def _gap(self, device: int | None, start: float, end: float, cause: str) -> None:
        rule = self._thresholds.idle_gap
        length = end - start
        if not rule.enabled or length < rule.min_s:
            return
        where, advice = _GAP_CAUSES[cause]
        if cause == "input":
            advice = self._advice["input_wait_high"]
        subject = "Training did no compute" if device is None else f"GPU {device} was idle"
        self._emit(rule.RULE, device, "firing", start, None, length, rule.min_s,
                   f"{subject} for {_num(length)} s (alert at {_setting(rule.min_s)} s), mostly {where}. {advice}")
        self._emit(rule.RULE, device, "resolved", start, end, length, rule.min_s,
                   f"The {_num(length)} s idle gap has ended.")

    # --- firing and resolving --------------------------------------------------------------------------
    def _judge(self, rule: str, device: int | None, time: float, value: float, fire_at: float,
               resolve_at: float, describe: Callable[[float], str], *, high: bool = True) -> None:
        """Fire when `value` is past `fire_at` (above it if `high`, else below); resolve once back at `resolve_at`."""
        sign = 1.0 if high else -1.0
        unit = getattr(self._thresholds, rule).UNIT
        alert = self._open.get((rule, device))
        if alert is None:
            if sign * value > sign * fire_at:
                event = self._emit(rule, device, "firing", time, None, value, fire_at,
                                   f"{describe(value)} (alert {'above' if high else 'below'} {_setting(fire_at)}"
                                   f"{unit}). {self._advice[rule]}")
                self._open[rule, device] = _Open(time, event, value, value, describe)
            return
        alert.latest, alert.describe = value, describe
        alert.worst = max(alert.worst, value, key=lambda v: sign * v)
        if sign * value <= sign * resolve_at:
            self._close(rule, device, time, alert, resolve_at,
                        f"Resolved: {describe(value)}; the worst was {_num(alert.worst)}{unit}.")

    def _close(self, rule: str, device: int | None, time: float, alert: _Open, threshold: float,
               message: str) -> None:
        del self._open[rule, device]
        self._emit(rule, device, "resolved", alert.start, time, alert.latest, threshold, message)

    def _emit(self, rule: str, device: int | None, state: State, start: float, end: float | None, value: float,
              threshold: float, message: str) -> AlertEvent:
        offset = self.wall_offset_s
        event = AlertEvent(rule, device, state, start + offset, None if end is None else end + offset,
                           float(value), float(threshold), message)
        self._events.append(event)
        return event

    def _window(self, rule: str, device: int, span_s: float) -> _Window:
        window = self._device_windows.get((rule, device))
        if window is None:
            window = self._device_windows[rule, device] = _Window(span_s)
        return window

    def _reasons(self, device: int) -> str:
        bits = self._throttle_bits.get(device, 0)
        return ", ".join(name for name, bit in THROTTLE_REASONS.items() if bits & bit) or "none"


def _event_time(event: AlertEvent) -> float:
    return event.start if event.end is None else event.end


def _median_of_sorted(values: list[float]) -> float:
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _setting(value: float) -> str:
    """A threshold as the user set it (0.25 stays 0.25, where a measurement is shown to one decimal)."""
    return _num(value, 3)


def _num(value: float, digits: int = 1) -> str:
    """`value` with up to `digits` decimals and no trailing zeros: 20, 12.5, 1.83."""
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
