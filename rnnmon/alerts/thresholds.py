"""Alert thresholds: one frozen group per rule, validated on construction, plain JSON both ways.

Each rule has `enabled`, the value that fires it, the value that resolves it (the gap between the two is the
hysteresis that stops an alert from flapping), and `for_s`, the trailing window its value is measured over.
`from_dict` fills missing keys with defaults and rejects unknown ones; `to_dict` is plain JSON. Every key is
declared once, with its `Key`: the check on construction and the tab's form (`Thresholds.schema()`, served by
`GET /thresholds`) both read it. The file the TensorBoard tab saves them in is rnnmon.alerts.thresholds_file.

Example:
    >>> thresholds = Thresholds.from_dict({"gpu_util_low": {"pct": 10, "resolve_pct": 15}})
    >>> thresholds.gpu_util_low.for_s
    60.0
    >>> Thresholds.schema()["gpu_util_low"]["keys"][1]
    {'key': 'pct', 'role': 'fire', 'words': 'below', 'unit': '%', 'kind': 'number', 'low': 0, 'high': 100, ...}
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
class Key:
    """One key of a rule: how its value is checked, and where and in which words the tab's form shows it.

    `kind` is flag, number, integer or names (a list drawn from `choices`). A number lies between `low` and
    `high`, `low` itself left out when `low_open`; each bound is a number, None for none, or the name of a key
    declared before this one, whose value is the bound. `role` is the form's column (on, fire, resolve, window
    or more); `words` come before the field, `unit` after it.
    """

    role: str
    words: str
    unit: str = ""
    kind: str = "number"
    low: float | str | None = None
    high: float | str | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()

    def check(self, group: Rule, key: str) -> None:
        """Raise ValueError naming the rule, key and value unless `group.key` fits; a list of names becomes a
        tuple without repeats."""
        value, where = getattr(group, key), f"{group.RULE}.{key}"
        if self.kind == "flag":
            if not isinstance(value, bool):
                raise ValueError(f"{where} must be true or false. Received: {value!r}")
        elif self.kind == "names":
            if not isinstance(value, (list, tuple)) \
                    or not all(isinstance(name, str) and name in self.choices for name in value):
                raise ValueError(f"{where} must be a list of names from {', '.join(self.choices)}. "
                                 f"Received: {value!r}")
            object.__setattr__(group, key, tuple(dict.fromkeys(value)))  # a JSON list becomes a tuple
        else:
            self._check_number(where, value, self._bound(group, self.low, -math.inf),
                                self._bound(group, self.high, math.inf))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "choices": list(self.choices)}

    @staticmethod
    def _bound(group: Rule, bound: float | str | None, none: float) -> float:
        return none if bound is None else getattr(group, bound) if isinstance(bound, str) else bound

    def _check_number(self, where: str, value: Any, low: float, high: float) -> None:
        integer = self.kind == "integer"
        kinds = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not _finite(value):
            raise ValueError(f"{where} must be {'an integer' if integer else 'a finite number'}. "
                             f"Received: {_short(value)}")
        if (value <= low if self.low_open else value < low) or value > high:
            if high < math.inf:
                span = f"in {'(' if self.low_open else '['}{low:g}, {high:g}]"
            else:
                span = f"{'>' if self.low_open else '>='} {low:g}"
            note = (f" (at least {self.low})" if isinstance(self.low, str)
                    else f" (at most {self.high})" if isinstance(self.high, str) else "")
            raise ValueError(f"{where} must be {span}{note}. Received: {_short(value)}")


_ON = Key("on", "on", kind="flag")
_WINDOW = Key("window", "over", "s", low=0, low_open=True)


def _key(default: Any, key: Key) -> Any:
    """A rule's field: its default, checked against `key` (see `Rule`)."""
    return dataclasses.field(default=default, metadata={"key": key})


@dataclasses.dataclass(frozen=True)
class Rule:
    """The thresholds of one rule; each field is checked on construction against its `Key` (the field's metadata)."""

    RULE: ClassVar[str]  # its name, and its field's in Thresholds
    LABEL: ClassVar[str]  # its name in the tab's form
    HELP: ClassVar[str]  # what it measures, in the tab's form
    UNIT: ClassVar[str]  # after its alerts' value and threshold: "%", " ms"

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            field.metadata["key"].check(self, field.name)

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """Its label, help, unit and keys, in order (`Key.to_dict()` with the key's name)."""
        return {"label": cls.LABEL, "help": cls.HELP, "unit": cls.UNIT,
                "keys": [{"key": field.name, **field.metadata["key"].to_dict()} for field in dataclasses.fields(cls)]}


@dataclasses.dataclass(frozen=True)
class GpuUtilLow(Rule):
    """Per GPU: utilization, time-weighted over the last `for_s` seconds, below `pct`; resolves at `resolve_pct`."""

    RULE: ClassVar[str] = "gpu_util_low"
    LABEL: ClassVar[str] = "GPU utilization low"
    HELP: ClassVar[str] = "Per GPU: mean utilization over the window."
    UNIT: ClassVar[str] = "%"
    enabled: bool = _key(True, _ON)
    pct: float = _key(20.0, Key("fire", "below", "%", low=0, high=100))
    resolve_pct: float = _key(30.0, Key("resolve", "back at", "%", low="pct", high=100))
    for_s: float = _key(60.0, _WINDOW)


@dataclasses.dataclass(frozen=True)
class InputWaitHigh(Rule):
    """Input wait above `pct` of step time (step + host gap) over the steps ending in the last `for_s` seconds."""

    RULE: ClassVar[str] = "input_wait_high"
    LABEL: ClassVar[str] = "Input wait high"
    HELP: ClassVar[str] = "Input wait as a share of step time."
    UNIT: ClassVar[str] = "%"
    enabled: bool = _key(True, _ON)
    pct: float = _key(20.0, Key("fire", "above", "%", low=0, high=100))
    resolve_pct: float = _key(10.0, Key("resolve", "back at", "%", low=0, high="pct"))
    for_s: float = _key(30.0, _WINDOW)


@dataclasses.dataclass(frozen=True)
class IdleGap(Rule):
    """Per GPU (or per run without one): an idle gap of at least `min_s` seconds, reported once it has closed."""

    RULE: ClassVar[str] = "idle_gap"
    LABEL: ClassVar[str] = "Idle gap"
    HELP: ClassVar[str] = "A GPU (without one: training) idle at a stretch."
    UNIT: ClassVar[str] = " s"
    enabled: bool = _key(True, _ON)
    min_s: float = _key(10.0, Key("fire", "at least", "s", low=0, low_open=True))


@dataclasses.dataclass(frozen=True)
class StepTimeHigh(Rule):
    """Median step time per batch over the last `for_s` seconds above `ms`; off by default (it depends on the model)."""

    RULE: ClassVar[str] = "step_time_high"
    LABEL: ClassVar[str] = "Step time high"
    HELP: ClassVar[str] = "Median step time per batch."
    UNIT: ClassVar[str] = " ms"
    enabled: bool = _key(False, _ON)
    ms: float = _key(1000.0, Key("fire", "above", "ms", low=0, low_open=True))
    resolve_ms: float = _key(900.0, Key("resolve", "back at", "ms", low=0, high="ms", low_open=True))
    for_s: float = _key(30.0, _WINDOW)


@dataclasses.dataclass(frozen=True)
class StepTimeRegression(Rule):
    """Median step time over the last `for_s` seconds above `ratio` times the median of the first `baseline_steps`."""

    RULE: ClassVar[str] = "step_time_regression"
    LABEL: ClassVar[str] = "Step time regression"
    HELP: ClassVar[str] = "Median step time against the median of the first steps."
    UNIT: ClassVar[str] = "×"
    enabled: bool = _key(True, _ON)
    ratio: float = _key(1.5, Key("fire", "above", "×", low=1, low_open=True))
    resolve_ratio: float = _key(1.2, Key("resolve", "back at", "×", low=1, high="ratio"))
    baseline_steps: int = _key(50, Key("more", "baseline: first", "steps", kind="integer", low=1))
    for_s: float = _key(30.0, _WINDOW)


@dataclasses.dataclass(frozen=True)
class GpuMemoryHigh(Rule):
    """Per GPU: memory used, time-weighted over the last `for_s` seconds, above `pct` of the total."""

    RULE: ClassVar[str] = "gpu_memory_high"
    LABEL: ClassVar[str] = "GPU memory high"
    HELP: ClassVar[str] = "Per GPU: memory used, of the total."
    UNIT: ClassVar[str] = "%"
    enabled: bool = _key(True, _ON)
    pct: float = _key(95.0, Key("fire", "above", "%", low=0, high=100))
    resolve_pct: float = _key(90.0, Key("resolve", "back at", "%", low=0, high="pct"))
    for_s: float = _key(30.0, _WINDOW)


@dataclasses.dataclass(frozen=True)
class GpuThrottled(Rule):
    """Per GPU: one of `reasons` active for more than `pct` of the last `for_s` seconds (see THROTTLE_REASONS)."""

    RULE: ClassVar[str] = "gpu_throttled"
    LABEL: ClassVar[str] = "GPU throttled"
    HELP: ClassVar[str] = "Per GPU: share of the time clocks were held back."
    UNIT: ClassVar[str] = "%"
    enabled: bool = _key(True, _ON)
    pct: float = _key(50.0, Key("fire", "above", "%", low=0, high=100))
    resolve_pct: float = _key(10.0, Key("resolve", "back at", "%", low=0, high="pct"))
    for_s: float = _key(30.0, _WINDOW)
    reasons: tuple[str, ...] = _key(tuple(THROTTLE_REASONS), Key("more", "reasons", kind="names",
                                                                 choices=tuple(THROTTLE_REASONS)))

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

    @classmethod
    def schema(cls) -> dict[str, dict[str, Any]]:
        """Each rule's `Rule.schema()`, in order: the tab builds its form, and its alerts' units, from it."""
        return {field.name: field.default_factory.schema() for field in dataclasses.fields(cls)}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {rule: {key: list(value) if isinstance(value, tuple) else value for key, value in group.items()}
                for rule, group in dataclasses.asdict(self).items()}


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
