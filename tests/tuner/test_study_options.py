"""Study options: validation and their JSON form (pure, no store)."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.measurement import MeasurementPolicy
from tuner.study_options import (
    MemoryPolicy,
    OptionsError,
    StudyOptions,
    measurement_policy,
    memory_policy,
)


def test_round_trip_and_defaults() -> None:
    options = StudyOptions(
        strategy_options={"n_initial_points": 3},
        measurement=MeasurementPolicy(warmup_s=5, window_s=30, min_samples=6),
        ranks=8,
        slo_s=0.25,
        driven_by="agent",
        max_trials=12,
        ack_timeout_s=90,
        warm_start_from=(4, 2),
        memory=MemoryPolicy(enabled=False, headroom=0.2),
    )
    assert StudyOptions.from_dict(options.to_dict()) == options
    assert StudyOptions.from_dict({}) == StudyOptions() == StudyOptions.from_dict(None)
    assert StudyOptions().driven_by == "tuner" and StudyOptions().max_trials is None
    assert StudyOptions().memory == MemoryPolicy(enabled=True, headroom=0.1)


def test_the_promql_objective_s_expression_is_kept_only_when_given() -> None:
    expr = "sum(rate(tokens_total{job=$job}[1m]))"
    options = StudyOptions(objective_expr=expr)
    assert options.to_dict()["objective_expr"] == expr
    assert StudyOptions.from_dict(options.to_dict()) == options
    assert "objective_expr" not in StudyOptions().to_dict(), "stored options stay as they were"
    with pytest.raises(OptionsError, match="objective_expr must be a PromQL expression"):
        StudyOptions.from_dict({"objective_expr": 3})


def test_the_throughput_floor_is_kept_only_when_given() -> None:
    options = StudyOptions(throughput_floor=500)
    assert options.to_dict()["throughput_floor"] == 500.0
    assert StudyOptions.from_dict(options.to_dict()) == options
    assert "throughput_floor" not in StudyOptions().to_dict(), "stored options stay as they were"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"rank": 2}, "unknown study option rank"),
        ({"ranks": 0}, "ranks must be a positive integer"),
        ({"ranks": True}, "ranks must be a positive integer"),
        ({"max_trials": 1.5}, "max_trials must be a positive integer"),
        ({"slo_s": -1}, "slo_s must be a positive number"),
        ({"slo_s": float("nan")}, "slo_s must be a positive number"),
        ({"driven_by": "human"}, "driven_by must be one of tuner, agent"),
        ({"ack_timeout_s": 0}, "ack_timeout_s must be a positive number"),
        ({"warm_start_from": [1, -2]}, "warm_start_from must be a positive integer"),
        ({"measurement": {"window_s": 0}}, "measurement.window_s must be > 0"),
        ({"measurement": {"windows": 3}}, "unknown measurement option windows"),
        ({"measurement": [1]}, "measurement must be an object"),
        ({"strategy_options": [1]}, "strategy_options must be an object"),
        ({"memory": {"headroom": 1}}, r"memory.headroom must be a fraction .* \[0, 1\)"),
        ({"memory": {"headroom": -0.1}}, "memory.headroom must be a fraction"),
        ({"memory": {"headroom": "10%"}}, "memory.headroom must be a fraction"),
        ({"memory": {"enabled": "no"}}, "memory.enabled must be true or false"),
        ({"memory": {"head_room": 0.1}}, "unknown memory option head_room"),
        ({"memory": 0.1}, "memory must be an object"),
        ({"throughput_floor": 0}, "throughput_floor must be a positive number"),
        ({"throughput_floor": "fast"}, "throughput_floor must be a positive number"),
    ],
)
def test_bad_options_are_refused_in_one_line(data: dict[str, Any], reason: str) -> None:
    with pytest.raises(OptionsError, match=reason) as raised:
        StudyOptions.from_dict(data)
    assert "\n" not in str(raised.value)


def test_measurement_policy_from_json() -> None:
    assert measurement_policy(None) == MeasurementPolicy()
    policy = MeasurementPolicy(warmup_s=1)
    assert measurement_policy(policy) is policy
    assert measurement_policy({"max_extensions": 0}).max_extensions == 0


def test_memory_policy_from_json() -> None:
    assert memory_policy(None) == MemoryPolicy()
    assert memory_policy({"headroom": 0}) == MemoryPolicy(enabled=True, headroom=0.0)
    assert memory_policy({"enabled": False}).headroom == 0.1
