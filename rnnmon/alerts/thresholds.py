"""Alert thresholds: one frozen group per rule, validated on construction, plain JSON both ways.

Each rule has `enabled`, the value that fires it, the value that resolves it (the gap between the two is the
hysteresis that stops an alert from flapping), and `for_s`, the trailing window its value is measured over.
`from_dict` fills missing keys with defaults and rejects unknown ones; `to_dict` is plain JSON. The file the
TensorBoard tab saves them in is rnnmon.alerts.thresholds_file.

Example:
    >>> thresholds = Thresholds.from_dict({"gpu_util_low": {"pct": 10, "resolve_pct": 15}})
    >>> thresholds.gpu_util_low.for_s
    60.0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

THROTTLE_REASONS: dict[str, int] = {  # pynvml.nvmlClocksEventReason* bits that mean thermal or power throttling
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}


@dataclasses.dataclass(frozen=True)
class GpuUtilLow:
    """Per GPU: utilization, time-weighted over the last `for_s` seconds, below `pct`; resolves at `resolve_pct`."""

    RULE: ClassVar[str] = "gpu_util_low"
    enabled: bool = True
    pct: float = 20.0
    resolve_pct: float = 30.0
    for_s: float = 60.0

    def __post_init__(self) -> None:
        _check_flag(self, "enabled")
        _check_number(self, "pct", 0, 100)
        _check_number(self, "resolve_pct", self.pct, 100, note="at least pct")
        _check_number(self, "for_s", 0, low_open=True)


@dataclasses.dataclass(frozen=True)
class InputWaitHigh:
    """Input wait above `pct` of step time (step + host gap) over the steps ending in the last `for_s` seconds."""

    RULE: ClassVar[str] = "input_wait_high"
    enabled: bool = True
    pct: float = 20.0
    resolve_pct: float = 10.0
    for_s: float = 30.0

    def __post_init__(self) -> None:
        _check_flag(self, "enabled")
        _check_number(self, "pct", 0, 100)
        _check_number(self, "resolve_pct", 0, self.pct, note="at most pct")
        _check_number(self, "for_s", 0, low_open=True)


@dataclasses.dataclass(frozen=True)
class IdleGap:
    """Per GPU (or per run without one): an idle gap of at least `min_s` seconds, reported once it has closed."""

    RULE: ClassVar[str] = "idle_gap"
    enabled: bool = True
    min_s: float = 10.0

    def __post_init__(self) -> None:
        _check_flag(self, "enabled")
        _check_number(self, "min_s", 0, low_open=True)


@dataclasses.dataclass(frozen=True)
class StepTimeHigh:
    """Median step time per batch over the last `for_s` seconds above `ms`; off by default (it depends on the model)."""

    RULE: ClassVar[str] = "step_time_high"
    enabled: bool = False
    ms: float = 1000.0
    resolve_ms: float = 900.0
    for_s: float = 30.0

    def __post_init__(self) -> None:
        _check_flag(self, "enabled")
        _check_number(self, "ms", 0, low_open=True)
        _check_number(self, "resolve_ms", 0, self.ms, low_open=True, note="at most ms")
        _check_number(self, "for_s", 0, low_open=True)


@dataclasses.dataclass(frozen=True)
class StepTimeRegression:
    """Median step time over the last `for_s` seconds above `ratio` times the median of the first `baseline_steps`."""

    RULE: ClassVar[str] = "step_time_regression"
    enabled: bool = True
    ratio: float = 1.5
    resolve_ratio: float = 1.2
    baseline_steps: int = 50
    for_s: float = 30.0

    def __post_init__(self) -> None:
        _check_flag(self, "enabled")
        _check_number(self, "ratio", 1, low_open=True)
        _check_number(self, "resolve_ratio", 1, self.ratio, note="at most ratio")
        _check_number(self, "baseline_steps", 1, integer=True)
        _check_number(self, "for_s", 0, low_open=True)


@dataclasses.dataclass(frozen=True)
class GpuMemoryHigh:
    """Per GPU: memory used, time-weighted over the last `for_s` seconds, above `pct` of the total."""

    RULE: ClassVar[str] = "gpu_memory_high"
    enabled: bool = True
    pct: float = 95.0
    resolve_pct: float = 90.0
    for_s: float = 30.0

    def __post_init__(self) -> None:
        _check_flag(self, "enabled")
        _check_number(self, "pct", 0, 100)
        _check_number(self, "resolve_pct", 0, self.pct, note="at most pct")
        _check_number(self, "for_s", 0, low_open=True)


@dataclasses.dataclass(frozen=True)
class GpuThrottled:
    """Per GPU: one of `reasons` active for more than `pct` of the last `for_s` seconds (see THROTTLE_REASONS)."""

    RULE: ClassVar[str] = "gpu_throttled"
    enabled: bool = True
    pct: float = 50.0
    resolve_pct: float = 10.0
    for_s: float = 30.0
    reasons: tuple[str, ...] = tuple(THROTTLE_REASONS)

    def __post_init__(self) -> None:
        _check_flag(self, "enabled")
        _check_number(self, "pct", 0, 100)
        _check_number(self, "resolve_pct", 0, self.pct, note="at most pct")
        _check_number(self, "for_s", 0, low_open=True)
        reasons = self.reasons
        if not isinstance(reasons, (list, tuple)) \
                or not all(isinstance(name, str) and name in THROTTLE_REASONS for name in reasons):
            raise ValueError(f"gpu_throttled.reasons must be a list of names from {', '.join(THROTTLE_REASONS)}. "
                             f"Received: {reasons!r}")
        object.__setattr__(self, "reasons", tuple(dict.fromkeys(reasons)))  # a JSON list becomes a tuple

    @property
    def mask(self) -> int:
        """The clocks_event_reasons bits this rule watches."""
        return sum(THROTTLE_REASONS[name] for name in self.reasons)


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """All alert thresholds; each field is named after its rule.

    Example:
        >>> Thresholds().to_dict()["input_wait_high"]
        {'enabled': True, 'pct': 20.0, 'resolve_pct': 10.0, 'for_s': 30.0}
    """

    gpu_util_low: GpuUtilLow = dataclasses.field(default_factory=GpuUtilLow)
    input_wait_high: InputWaitHigh = dataclasses.field(default_factory=InputWaitHigh)
    idle_gap: IdleGap = dataclasses.field(default_factory=IdleGap)
    step_time_high: StepTimeHigh = dataclasses.field(default_factory=StepTimeHigh)
    step_time_regression: StepTimeRegression = dataclasses.field(default_factory=StepTimeRegression)
    gpu_memory_high: GpuMemoryHigh = dataclasses.field(default_factory=GpuMemoryHigh)
    gpu_throttled: GpuThrottled = dataclasses.field(default_factory=GpuThrottled)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Thresholds:
        """Thresholds from JSON data; missing rules and keys keep their defaults, unknown ones raise ValueError."""
        defaults = cls()
        _check_keys("thresholds", data, [f.name for f in dataclasses.fields(cls)])
        groups = {}
        for rule, values in data.items():
            default = getattr(defaults, rule)
            _check_keys(rule, values, [f.name for f in dataclasses.fields(default)])
            groups[rule] = dataclasses.replace(default, **values)
        return cls(**groups)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {rule: {key: list(value) if isinstance(value, tuple) else value for key, value in group.items()}
                for rule, group in dataclasses.asdict(self).items()}


def _check_flag(group: Any, key: str) -> None:
    value = getattr(group, key)
    if not isinstance(value, bool):
        raise ValueError(f"{group.RULE}.{key} must be true or false. Received: {value!r}")


def _check_number(group: Any, key: str, low: float, high: float = math.inf, *, low_open: bool = False,
                  integer: bool = False, note: str = "") -> None:
    """Raise ValueError unless `group.key` is a finite number (an int if `integer`) in the range given."""
    value = getattr(group, key)
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not _finite(value):
        raise ValueError(f"{group.RULE}.{key} must be {'an integer' if integer else 'a finite number'}. "
                         f"Received: {_short(value)}")
    if (value <= low if low_open else value < low) or value > high:
        if high < math.inf:
            span = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        else:
            span = f"{'>' if low_open else '>='} {low:g}"
        raise ValueError(f"{group.RULE}.{key} must be {span}{f' ({note})' if note else ''}. "
                         f"Received: {_short(value)}")


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float (a 400-digit number)
        return False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _check_keys(where: str, data: Any, valid: list[str]) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a JSON object. Received: {data!r}")
    unknown = [key for key in data if key not in valid]
    if unknown:
        raise ValueError(f"Unknown key(s) in {where}: {', '.join(map(str, unknown))}. "
                         f"Valid keys: {', '.join(valid)}.")
