"""Objectives: Pollux goodput checked by hand, the SLO objective, the registry."""

from __future__ import annotations

import math

import pytest

from tuner.objectives import (
    OBJECTIVES,
    Evaluation,
    ObjectiveError,
    check_direction,
    default_objective,
    get_objective,
    goodput,
    slo_throughput,
    statistical_efficiency,
    throughput,
)


@pytest.mark.parametrize(
    ("thr", "m", "phi", "m0", "expected"),
    [
        # M = M0: efficiency 1, goodput = throughput.
        (1000.0, 256, 1024.0, 256, 1000.0),
        # (1024 + 256) / (1024 + 1024) = 0.625.
        (1000.0, 1024, 1024.0, 256, 625.0),
        # phi = 0 (no gradient noise): E = M0 / M, goodput = steps/s * M0 = (1000 / 1024) * 256.
        (1000.0, 1024, 0.0, 256, 250.0),
        # phi >> M: nearly perfect scaling.
        (1000.0, 1024, 1e9, 256, 1000.0 * (1e9 + 256) / (1e9 + 1024)),
        # (4096 + 512) / (4096 + 2048) = 0.75.
        (2400.0, 2048, 4096.0, 512, 1800.0),
        # A batch below M0 is more efficient per sample: (100 + 64) / (100 + 32).
        (500.0, 32, 100.0, 64, 500.0 * 164 / 132),
    ],
)
def test_goodput_matches_hand_computed_pollux_values(thr, m, phi, m0, expected) -> None:
    assert goodput(thr, m, phi, m0) == pytest.approx(expected)


def test_efficiency_agrees_with_the_gain_form() -> None:
    # AdaptDL writes the per-step gain with the gradient's squared norm (sqr) and its variance
    # at batch M0 (var = tr(Sigma) / M0): gain = (var + sqr) / (var / scale + sqr),
    # scale = M / M0, and efficiency = gain / scale. With sqr = 1 and phi = tr(Sigma)/|g|^2:
    m0, m, phi = 256, 1024, 1024.0
    sqr, var, scale = 1.0, phi / m0, m / m0
    gain = (var + sqr) / (var / scale + sqr)
    assert gain == pytest.approx(2.5)  # one step at M is worth 2.5 steps at M0
    assert statistical_efficiency(m, phi, m0) == pytest.approx(gain / scale)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: goodput(-1.0, 256, 1.0, 256), "throughput_samples_s must be a finite number >= 0"),
        (lambda: goodput(1.0, 0, 1.0, 256), "effective_batch must be a positive"),
        (lambda: goodput(1.0, 256, -1.0, 256), "noise_scale must be a finite number >= 0"),
        (lambda: goodput(1.0, 256, math.nan, 256), "noise_scale"),
        (lambda: goodput(1.0, 256, 1.0, 0), "base_batch must be a positive"),
        (lambda: throughput(math.inf), "throughput_samples_s"),
        (lambda: slo_throughput(10.0, 0.1, 0.0), "slo_s must be a positive"),
    ],
)
def test_formulas_refuse_out_of_domain_values(call, message) -> None:
    with pytest.raises(ObjectiveError, match=message):
        call()


@pytest.mark.parametrize(
    ("p99", "status", "value"),
    [(0.150, "ok", 900.0), (0.200, "ok", 900.0), (0.201, "infeasible", None)],
)
def test_slo_throughput(p99: float, status: str, value: float | None) -> None:
    result = slo_throughput(900.0, p99, 0.2)
    assert (result.status, result.value) == (status, value)
    if status == "infeasible":
        assert "p99 latency 0.201 s > SLO 0.2 s" in result.reason


def test_registry_directions_and_defaults() -> None:
    assert sorted(OBJECTIVES) == [
        "goodput",
        "offered_load_p99",
        "promql",
        "samples_per_joule",
        "slo_throughput",
        "step_time",
        "throughput",
        "tokens_per_joule",
    ]
    assert get_objective("samples_per_joule").direction == "maximize"
    assert get_objective("goodput").direction == "maximize"
    assert get_objective("step_time").direction == "minimize"
    assert get_objective("offered_load_p99").direction == "minimize"
    assert default_objective("training").name == "goodput"
    assert default_objective("inference").name == "slo_throughput"
    with pytest.raises(ObjectiveError, match="unknown objective 'goodptu'; known: goodput, "):
        get_objective("goodptu")
    with pytest.raises(ObjectiveError, match="unknown job kind 'batch'"):
        default_objective("batch")
    with pytest.raises(ObjectiveError, match="unknown direction 'up'"):
        check_direction("up")


@pytest.mark.parametrize(
    ("name", "inputs", "expected"),
    [
        (
            "goodput",
            {
                "throughput_samples_s": 1000.0,
                "effective_batch": 1024,
                "noise_scale": 1024.0,
                "base_batch": 256,
            },
            Evaluation("ok", 625.0),
        ),
        ("throughput", {"throughput_samples_s": 10.0}, Evaluation("ok", 10.0)),
        ("step_time", {"step_time_s": 0.5}, Evaluation("ok", 0.5)),
        (
            "goodput",
            {"throughput_samples_s": 1000.0, "effective_batch": 1024, "base_batch": 256},
            Evaluation("missing", None, "goodput: no noise_scale"),
        ),
        (
            "goodput",
            {
                "throughput_samples_s": 1000.0,
                "effective_batch": 1024,
                "noise_scale": math.nan,
                "base_batch": 256,
            },
            Evaluation("missing", None, "goodput: noise_scale is nan"),
        ),
        (
            "throughput",
            {"throughput_samples_s": None},
            Evaluation("missing", None, "throughput: no throughput_samples_s"),
        ),
        (
            "throughput",
            {"throughput_samples_s": "fast"},
            Evaluation("missing", None, "throughput: throughput_samples_s is not a number: 'fast'"),
        ),
        (
            "slo_throughput",
            {"throughput": 50.0, "p99_latency_s": 0.5, "slo_s": 0.25},
            Evaluation("infeasible", None, "slo: p99 latency 0.5 s > SLO 0.25 s"),
        ),
        # 1200 samples/s on GPUs drawing 600 J/s: 2 samples per joule.
        (
            "samples_per_joule",
            {"throughput_samples_s": 1200.0, "gpu_power_w": 600.0, "throughput_floor": 0.0},
            Evaluation("ok", 2.0),
        ),
        (
            "tokens_per_joule",
            {"throughput_tokens_s": 9000.0, "gpu_power_w": 300.0, "throughput_floor": 8000.0},
            Evaluation("ok", 30.0),
        ),
        (
            "samples_per_joule",
            {"throughput_samples_s": 900.0, "gpu_power_w": 300.0, "throughput_floor": 1000.0},
            Evaluation("infeasible", None, "throughput_floor: throughput 900/s < floor 1000/s"),
        ),
        (
            "samples_per_joule",
            {"throughput_samples_s": 900.0, "gpu_power_w": None, "throughput_floor": 0.0},
            Evaluation("missing", None, "samples_per_joule: no gpu_power_w"),
        ),
    ],
)
def test_evaluate_never_turns_missing_data_into_a_value(name, inputs, expected) -> None:
    assert get_objective(name).evaluate(inputs) == expected


def test_evaluate_reports_invalid_measurements_as_missing() -> None:
    result = get_objective("step_time").evaluate({"step_time_s": -1.0})
    assert result.status == "missing"
    assert result.value is None
    assert "invalid measurement: step_time_s must be a positive" in result.reason


def test_per_joule_needs_power_drawn() -> None:
    result = get_objective("samples_per_joule").evaluate(
        {"throughput_samples_s": 10.0, "gpu_power_w": 0.0, "throughput_floor": 0.0}
    )
    assert result.status == "missing"
    assert "gpu_power_w must be a positive finite number" in result.reason


def _offered(offered: float, served: float, p99: float, slo: float = 0.15) -> Evaluation:
    inputs = {"offered_rate": offered, "served_rate": served, "p99_latency_s": p99, "slo_s": slo}
    return get_objective("offered_load_p99").evaluate(inputs)


def test_offered_load_p99_ranks_configs_that_keep_up_by_their_p99() -> None:
    # Both serve the 20 requests/s arriving: throughput cannot tell them apart, the P99 does.
    short_wait, long_wait = _offered(20.0, 20.0, 0.02), _offered(20.0, 19.9, 0.12)
    assert short_wait == Evaluation.ok(0.02)
    assert long_wait == Evaluation.ok(0.12)


def test_offered_load_p99_puts_every_config_that_falls_behind_after_those_that_keep_up() -> None:
    behind = _offered(80.0, 60.0, 0.1)
    further_behind = _offered(80.0, 40.0, 0.1)
    assert behind.value == pytest.approx(0.15 * (2 - 0.75))
    assert further_behind.value == pytest.approx(0.15 * 1.5)
    kept_up = _offered(80.0, 80.0, 0.149)
    assert kept_up.value is not None and behind.value is not None
    assert further_behind.value is not None
    assert kept_up.value < behind.value < further_behind.value  # minimized


def test_offered_load_p99_is_infeasible_over_the_slo_and_missing_without_a_rate() -> None:
    over = _offered(20.0, 20.0, 0.2)
    assert over.status == "infeasible" and over.reason.startswith("slo: p99 latency 0.2 s")
    assert _offered(0.0, 0.0, 0.01) == Evaluation.ok(0.01)  # no load: nothing to fall behind
    objective = get_objective("offered_load_p99")
    missing = objective.evaluate({"served_rate": 1.0, "p99_latency_s": 0.01, "slo_s": 0.15})
    assert missing.status == "missing" and "no offered_rate" in missing.reason
    assert _offered(-1.0, 1.0, 0.01).status == "missing"
