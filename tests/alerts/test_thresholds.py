"""Thresholds: defaults, JSON round trip, validation messages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rnnmon.alerts.thresholds import GpuThrottled, GpuUtilLow, Thresholds


def test_defaults_are_valid_and_survive_json() -> None:
    thresholds = Thresholds()
    data = json.loads(json.dumps(thresholds.to_dict()))
    assert data == thresholds.to_dict()
    assert Thresholds.from_dict(data) == thresholds
    assert data["gpu_util_low"] == {"enabled": True, "pct": 20.0, "resolve_pct": 30.0, "for_s": 60.0}
    assert data["step_time_high"]["enabled"] is False


def test_each_field_is_named_after_its_rule() -> None:
    thresholds = Thresholds()
    assert all(rule == getattr(thresholds, rule).RULE for rule in thresholds.to_dict())


def test_partial_dict_keeps_the_other_defaults() -> None:
    thresholds = Thresholds.from_dict({"gpu_util_low": {"pct": 10}, "idle_gap": {"enabled": False}})
    assert thresholds.gpu_util_low == GpuUtilLow(pct=10, resolve_pct=30.0, for_s=60.0)
    assert thresholds.idle_gap.enabled is False
    assert thresholds.input_wait_high == Thresholds().input_wait_high


def test_reasons_become_a_hashable_tuple_and_a_mask() -> None:
    rule = Thresholds.from_dict({"gpu_throttled": {"reasons": ["sw_thermal", "hw_thermal", "sw_thermal"]}})
    assert rule.gpu_throttled.reasons == ("sw_thermal", "hw_thermal")
    assert rule.gpu_throttled.mask == 0x20 | 0x40
    assert GpuThrottled().mask == 0x4 | 0x8 | 0x20 | 0x40 | 0x80
    assert hash(rule) != hash(Thresholds())
    assert rule.to_dict()["gpu_throttled"]["reasons"] == ["sw_thermal", "hw_thermal"]


@pytest.mark.parametrize(("data", "message"), [
    ({"gpu_util_low": {"pct": 150}}, "gpu_util_low.pct must be in [0, 100]. Received: 150"),
    ({"gpu_util_low": {"resolve_pct": 10}}, "gpu_util_low.resolve_pct must be in [20, 100] (at least pct). "
                                            "Received: 10"),
    ({"input_wait_high": {"resolve_pct": 25}}, "input_wait_high.resolve_pct must be in [0, 20] (at most pct)"),
    ({"input_wait_high": {"for_s": 0}}, "input_wait_high.for_s must be > 0. Received: 0"),
    ({"idle_gap": {"min_s": -1}}, "idle_gap.min_s must be > 0. Received: -1"),
    ({"step_time_high": {"ms": 100}}, "step_time_high.resolve_ms must be in (0, 100] (at most ms). Received: 900.0"),
    ({"step_time_regression": {"ratio": 1}}, "step_time_regression.ratio must be > 1. Received: 1"),
    ({"step_time_regression": {"baseline_steps": 2.5}}, "step_time_regression.baseline_steps must be an integer"),
    ({"step_time_regression": {"baseline_steps": 0}}, "step_time_regression.baseline_steps must be >= 1"),
    ({"gpu_memory_high": {"pct": "95"}}, "gpu_memory_high.pct must be a finite number. Received: '95'"),
    ({"gpu_memory_high": {"for_s": float("inf")}}, "gpu_memory_high.for_s must be a finite number"),
    ({"gpu_memory_high": {"for_s": float("nan")}}, "gpu_memory_high.for_s must be a finite number"),
    ({"gpu_throttled": {"pct": True}}, "gpu_throttled.pct must be a finite number. Received: True"),
    ({"gpu_throttled": {"enabled": "yes"}}, "gpu_throttled.enabled must be true or false. Received: 'yes'"),
    ({"gpu_throttled": {"reasons": ["gpu_idle"]}}, "gpu_throttled.reasons must be a list of names from "
                                                   "sw_power_cap, hw_slowdown"),
    ({"gpu_throttled": {"reasons": "sw_thermal"}}, "gpu_throttled.reasons must be a list"),
])
def test_invalid_values_are_rejected_with_rule_and_value(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Thresholds.from_dict(data)
    assert message in str(caught.value)


def test_unknown_keys_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"Unknown key\(s\) in thresholds: gpu_util\. Valid keys: gpu_util_low, "):
        Thresholds.from_dict({"gpu_util": {}})
    with pytest.raises(ValueError, match=r"in gpu_util_low: percent\. Valid keys: enabled, pct, resolve_pct, for_s"):
        Thresholds.from_dict({"gpu_util_low": {"percent": 10}})
    with pytest.raises(ValueError, match=r"gpu_util_low must be a JSON object\. Received: 10"):
        Thresholds.from_dict({"gpu_util_low": 10})
    with pytest.raises(ValueError, match="thresholds must be a JSON object"):
        Thresholds.from_dict([])  # type: ignore[arg-type]


def test_groups_validate_when_built_directly() -> None:
    with pytest.raises(ValueError, match=r"gpu_util_low\.pct must be in"):
        GpuUtilLow(pct=-1)


def test_the_schema_lists_every_key_with_the_bounds_its_check_applies() -> None:
    """What the tab's form is built from is what from_dict enforces: a value just past a served bound is refused."""
    defaults = Thresholds().to_dict()
    for rule, spec in Thresholds.schema().items():
        assert spec["unit"] == type(getattr(Thresholds(), rule)).UNIT and spec["label"] and spec["help"]
        assert [key["key"] for key in spec["keys"]] == list(defaults[rule])
        for key in spec["keys"]:
            for bad in _past_the_bounds(key, defaults[rule]):
                with pytest.raises(ValueError, match=rf"^{rule}\.{key['key']} must be"):
                    Thresholds.from_dict({rule: {key["key"]: bad}})


def _past_the_bounds(key: dict[str, Any], values: dict[str, Any]) -> list[Any]:
    """Values of the wrong kind or just outside the key's bounds (a bound naming a key is that key's value)."""
    if key["kind"] == "flag":
        return ["yes"]
    if key["kind"] == "names":
        return [[*key["choices"], "gpu_idle"], key["choices"][0]]
    bound = {side: values[key[side]] if isinstance(key[side], str) else key[side] for side in ("low", "high")}
    bad: list[Any] = ["1"]
    if key["kind"] == "integer":
        bad.append(bound["low"] + 0.5)
    if bound["low"] is not None:
        bad.append(bound["low"] if key["low_open"] else bound["low"] - 0.5)
    if bound["high"] is not None:
        bad.append(bound["high"] + 0.5)
    return bad
