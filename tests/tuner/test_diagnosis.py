"""The diagnosis rules on their own: thresholds, the order they are tried in, and when a rank
cannot be called a straggler."""

from __future__ import annotations

import math

import pytest

from tuner.diagnosis import (
    COMMUNICATION_BOUND_SHARE,
    INPUT_BOUND_SHARE,
    GpuActivity,
    RankTimings,
    Verdict,
    bad_input,
    diagnose,
    judge,
    stragglers,
)


def rank(name: str, step: float, buckets: int = 30, **phases: float) -> RankTimings:
    times = [float(b) for b in range(buckets)]
    wobble = [1 + 0.01 * math.sin(b) for b in range(buckets)]
    return RankTimings(
        name,
        {t: step * w for t, w in zip(times, wobble, strict=True)},
        {p: {t: s * w for t, w in zip(times, wobble, strict=True)} for p, s in phases.items()},
    )


@pytest.mark.parametrize(
    ("shares", "gpu", "verdict"),
    [
        ({"data_loading": INPUT_BOUND_SHARE, "grad_sync": 0.5}, None, Verdict.INPUT_BOUND),
        (
            {"data_loading": 0.29, "grad_sync": COMMUNICATION_BOUND_SHARE},
            None,
            Verdict.COMMUNICATION_BOUND,
        ),
        ({"forward": 0.3, "backward": 0.5}, GpuActivity(0.9, 0.3, 0.6), Verdict.MEMORY_BOUND),
        ({"forward": 0.3, "backward": 0.5}, GpuActivity(0.9, 0.7, 0.6), Verdict.COMPUTE_BOUND),
        ({"forward": 0.3, "backward": 0.5}, None, Verdict.COMPUTE_BOUND),
        ({"forward": 0.3, "backward": 0.5}, GpuActivity(0.5), Verdict.MIXED),
        ({"forward": 0.3, "backward": 0.5}, GpuActivity(0.1), Verdict.IDLE),
        ({"forward": 0.3, "backward": 0.2}, GpuActivity(0.9), Verdict.MIXED),
        ({"forward": 0.3, "backward": 0.2}, None, Verdict.MIXED),
    ],
)
def test_verdict_rules_in_order(
    shares: dict[str, float], gpu: GpuActivity | None, verdict: Verdict
) -> None:
    found, evidence = judge(shares, gpu)
    assert found is verdict and evidence


def test_compute_bound_without_gpu_metrics_says_so() -> None:
    _, evidence = judge({"forward": 0.3, "backward": 0.5}, None)
    assert "GPU utilisation not reported" in evidence[-1]


def test_bad_input_reasons() -> None:
    assert bad_input(rank("0", 1.0, forward=0.4, backward=0.5)) is None
    # Overlapping phases (all-reduce under backward) may pass the step a little.
    assert bad_input(rank("0", 1.0, forward=0.4, backward=0.5, grad_sync=0.45)) is None
    reason = bad_input(rank("0", 1.0, forward=0.6, backward=0.6, grad_sync=0.6))
    assert reason is not None and reason.startswith("phases sum to")
    reason = bad_input(rank("0", 1.0, forward=1.2))
    assert reason is not None and reason.startswith("phase forward")
    negative = RankTimings("0", {0.0: 1.0}, {}, lowest=-0.5)
    assert bad_input(negative) == "negative step or phase time (-0.5 s)"


def test_a_phase_timed_on_a_slow_step_is_bounded_by_the_buckets_longest_step() -> None:
    """Seen on a real DDP job timing phases every 10th step: a bucket's 20 steps average 50 ms,
    the one step with phases took 80 ms, 71 ms of it in grad_sync. Not impossible: the phase
    is inside its own step, the longest of the bucket."""
    sampled = RankTimings("0", {0.0: 0.050}, {"grad_sync": {0.0: 0.071}}, step_max={0.0: 0.080})
    assert bad_input(sampled) is None
    longer = RankTimings("0", {0.0: 0.050}, {"grad_sync": {0.0: 0.090}}, step_max={0.0: 0.080})
    reason = bad_input(longer)
    assert reason is not None and reason.startswith("phase grad_sync")


def test_no_straggler_with_one_rank_or_too_few_buckets() -> None:
    assert stragglers([rank("0", 1.0)]) == []
    short = [rank("0", 1.0, buckets=3), rank("1", 1.0, buckets=3), rank("2", 2.0, buckets=3)]
    assert stragglers(short) == []
    enough = [rank("0", 1.0), rank("1", 1.0), rank("2", 2.0)]
    assert [s.rank for s in stragglers(enough)] == ["2"]


def test_a_few_milliseconds_in_a_short_phase_is_no_straggler() -> None:
    # 50 % above the others in the optimizer, but 1 % of the step: not worth a page.
    ranks = [rank(str(r), 1.0, optimizer=0.02) for r in range(3)]
    ranks.append(rank("3", 1.0, optimizer=0.03))
    assert stragglers(ranks) == []


def test_diagnosis_without_ranks_is_no_data() -> None:
    found = diagnose([])
    assert found.verdict is Verdict.NO_DATA and found.summary == "no step timings in the window"
