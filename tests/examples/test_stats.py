"""The A/B verdict and the SLO windows on fixed inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from examples.inference.stats import (
    Record,
    ab_verdict,
    bootstrap_mean,
    slo_share,
    two_proportion_p,
    windows,
)


def records(latencies: np.ndarray, correct_every: int, variant: str) -> list[Record]:
    return [
        Record(i * 0.01, float(lat), True, i % correct_every != 0, variant)
        for i, lat in enumerate(latencies)
    ]


def test_a_faster_variant_with_the_same_accuracy() -> None:
    rng = np.random.default_rng(7)
    a = records(rng.gamma(4.0, 0.010, 2000), 30, "float32")  # median ~37 ms
    b = records(rng.gamma(4.0, 0.004, 2000), 31, "int8")  # median ~15 ms
    verdict = ab_verdict(a, b, duration_s=20.0, names=("float32", "int8"))
    assert verdict.throughput == (100.0, 100.0)
    assert verdict.latency_p_value < 1e-100
    assert verdict.p99_s[1] < verdict.p99_s[0]
    low, high = verdict.p99_diff_ci_s
    assert low < high < 0, "int8's P99 is lower, and the interval says so"
    assert verdict.accuracy_p_value > 0.05, "29/30 against 30/31: no evidence of a difference"
    assert verdict.summary.startswith("latency: int8 faster (Mann-Whitney p=")
    assert "accuracy 0.9665 vs 0.9675: no significant difference" in verdict.summary


def test_the_same_distribution_is_no_difference_and_a_worse_model_is_named() -> None:
    rng = np.random.default_rng(1)
    a = records(rng.gamma(4.0, 0.01, 1500), 50, "a")
    b = records(rng.gamma(4.0, 0.01, 1500), 5, "b")  # 98% against 80% correct
    verdict = ab_verdict(a, b, duration_s=15.0)
    assert verdict.latency_p_value > 0.05
    assert verdict.summary.startswith("latency: no significant difference")
    low, high = verdict.p99_diff_ci_s
    assert low < 0 < high
    assert verdict.accuracy_p_value < 1e-20 and "significantly different" in verdict.summary


def test_two_proportions_and_refusals() -> None:
    # 60/100 against 40/100: z = 2.83, p = 0.0047 (textbook pooled two-proportion test).
    assert two_proportion_p(60, 100, 40, 100) == pytest.approx(0.00468, abs=1e-4)
    assert two_proportion_p(10, 10, 10, 10) == 1.0
    assert math.isnan(two_proportion_p(1, 0, 1, 2))
    with pytest.raises(ValueError, match="at least 2 served requests"):
        ab_verdict([Record(0, 0.1, True, True)], [Record(0, 0.1, True, True)] * 3, 1.0)


def test_windows_count_unserved_requests_against_the_slo() -> None:
    served = [Record(t / 10, 0.02, True, True) for t in range(100)]  # 0-10 s: all fast
    slow = [Record(10 + t / 10, 0.02, t >= 5, True) for t in range(100)]  # 5 of 100 dropped
    found = windows([*served, *slow], width_s=10, duration_s=30)
    assert [(w.sent, w.served) for w in found] == [(100, 100), (100, 95), (0, 0)]
    assert found[0].within(0.05) and not found[1].within(0.05), "a dropped request is a miss"
    assert slo_share(found, 0.05) == 0.5, "the empty window does not count"
    mean, low, high = bootstrap_mean([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and 1.0 <= low < mean < high <= 4.0


def test_the_ab_command_reads_a_load_generator_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import asdict

    from examples.inference import ab

    rng = np.random.default_rng(3)
    a = [
        Record(i * 0.02, float(v), True, True, "float32", "http://a")
        for i, v in enumerate(rng.gamma(4.0, 0.01, 500))
    ]
    b = [
        Record(i * 0.02, float(v), i % 7 != 0, True, "int8", "http://b")
        for i, v in enumerate(rng.gamma(4.0, 0.004, 500))
    ]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"duration_s": 10.0, "records": [asdict(r) for r in a + b]}))
    ab.main([str(run), "--a", "http://a", "--b", "http://b"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("float32: 50.0 served/s")
    assert out[1].startswith("int8: 42.8 served/s"), "an unserved request counts against b"
    assert out[2].startswith("latency: int8 faster")
    with pytest.raises(SystemExit, match="no requests to http://c"):
        ab.main([str(run), "--a", "http://a", "--b", "http://c"])


def test_the_load_schedule_steps_its_rate() -> None:
    from examples.inference.loadgen import arrivals, schedule

    plan = schedule([20, 80, 0], 30.0)
    times = arrivals(plan, 30.0, seed=0)
    counts = [sum(start <= t < start + 30 for t in times) for start, _ in plan]
    assert 500 < counts[0] < 700 and 2100 < counts[1] < 2700 and counts[2] == 0
    assert times == sorted(times)
    with pytest.raises(ValueError, match="non-negative"):
        schedule([-1], 10.0)
