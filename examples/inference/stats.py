"""What a load run says: per-window service (requests served, P99, the SLO held or not), and
the A/B verdict between two variants served side by side.

Pure functions over the load generator's records, so the benchmark and the tests judge alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy import stats

ALPHA: Final = 0.05


@dataclass(frozen=True, slots=True)
class Record:
    """One request: when it was sent (seconds into the run), how long it took, whether it was
    served (HTTP 200 in time) and whether the answer matched the label."""

    sent_s: float
    latency_s: float
    served: bool
    correct: bool
    variant: str = ""
    target: str = ""
    """The replica it was sent to (its base URL)."""


@dataclass(frozen=True, slots=True)
class Window:
    start_s: float
    sent: int
    served: int
    p99_s: float
    """P99 over every request sent in the window; a request not served counts as infinite."""

    def within(self, slo_s: float) -> bool:
        return self.sent > 0 and self.p99_s <= slo_s


def p99(latencies: Sequence[float]) -> float:
    return (
        float(np.quantile(np.asarray(latencies, dtype=float), 0.99, method="higher"))
        if latencies
        else math.nan
    )


def windows(records: Sequence[Record], width_s: float, duration_s: float) -> list[Window]:
    """Consecutive windows of ``width_s`` over ``[0, duration_s)`` by send time."""
    count = max(0, math.floor(duration_s / width_s))
    buckets: list[list[Record]] = [[] for _ in range(count)]
    for record in records:
        index = math.floor(record.sent_s / width_s)
        if 0 <= index < count:
            buckets[index].append(record)
    return [
        Window(
            i * width_s,
            len(bucket),
            sum(r.served for r in bucket),
            p99([r.latency_s if r.served else math.inf for r in bucket]),
        )
        for i, bucket in enumerate(buckets)
    ]


def slo_share(found: Sequence[Window], slo_s: float) -> float:
    """The share of windows with traffic whose P99 met the SLO."""
    busy = [w for w in found if w.sent]
    return sum(w.within(slo_s) for w in busy) / len(busy) if busy else math.nan


def bootstrap_mean(
    values: Sequence[float], seed: int = 0, rounds: int = 10_000
) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% percentile-bootstrap interval."""
    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return math.nan, math.nan, math.nan
    draws = np.random.default_rng(seed).choice(data, size=(rounds, len(data)), replace=True)
    means = draws.mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(data.mean()), float(low), float(high)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Variant ``b`` against variant ``a`` on the same traffic."""

    throughput: tuple[float, float]
    """Requests served per second, a then b."""
    p99_s: tuple[float, float]
    p99_diff_ci_s: tuple[float, float]
    """95% bootstrap interval of P99(b) - P99(a)."""
    latency_p_value: float
    """Mann-Whitney U, two-sided: do b's latencies come from the same distribution as a's?"""
    accuracy: tuple[float, float]
    accuracy_p_value: float
    """Two-proportion z-test, two-sided, on the labelled requests' answers."""
    summary: str


def _p99_diff_ci(a: np.ndarray, b: np.ndarray, seed: int, rounds: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    diffs = np.empty(rounds)
    for i in range(rounds):
        diffs[i] = np.quantile(rng.choice(b, len(b)), 0.99) - np.quantile(
            rng.choice(a, len(a)), 0.99
        )
    low, high = np.quantile(diffs, [0.025, 0.975])
    return float(low), float(high)


def two_proportion_p(correct_a: int, n_a: int, correct_b: int, n_b: int) -> float:
    """Two-sided p-value that two success rates are equal (pooled z-test)."""
    if n_a == 0 or n_b == 0:
        return math.nan
    pooled = (correct_a + correct_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 1.0
    z = (correct_b / n_b - correct_a / n_a) / se
    return float(2 * stats.norm.sf(abs(z)))


def ab_verdict(
    a: Sequence[Record],
    b: Sequence[Record],
    duration_s: float,
    *,
    names: tuple[str, str] = ("a", "b"),
    seed: int = 0,
    rounds: int = 2_000,
) -> Verdict:
    """Compare two variants that served the same offered load for ``duration_s``: throughput,
    P99 (with a bootstrap interval of the difference), latencies (Mann-Whitney U) and accuracy
    (two-proportion z-test), and say in one line what is significant at 5%."""
    lat_a = np.asarray([r.latency_s for r in a if r.served])
    lat_b = np.asarray([r.latency_s for r in b if r.served])
    if len(lat_a) < 2 or len(lat_b) < 2:
        raise ValueError("each variant needs at least 2 served requests")
    served_a, served_b = len(lat_a), len(lat_b)
    correct_a = sum(r.correct for r in a if r.served)
    correct_b = sum(r.correct for r in b if r.served)
    latency_p = float(stats.mannwhitneyu(lat_a, lat_b, alternative="two-sided").pvalue)
    accuracy_p = two_proportion_p(correct_a, served_a, correct_b, served_b)
    ci = _p99_diff_ci(lat_a, lat_b, seed, rounds)
    p99s = (p99(lat_a.tolist()), p99(lat_b.tolist()))
    acc = (correct_a / served_a, correct_b / served_b)
    na, nb = names
    faster = nb if np.median(lat_b) < np.median(lat_a) else na
    parts = [
        f"latency: {faster} faster (Mann-Whitney p={latency_p:.2g})"
        if latency_p < ALPHA
        else f"latency: no significant difference (p={latency_p:.2g})",
        f"P99 {nb}-{na}: {1e3 * (p99s[1] - p99s[0]):+.1f} ms "
        f"[{1e3 * ci[0]:+.1f}, {1e3 * ci[1]:+.1f}]",
        f"accuracy {acc[0]:.4f} vs {acc[1]:.4f}: "
        + ("significantly different" if accuracy_p < ALPHA else "no significant difference")
        + f" (p={accuracy_p:.2g})",
    ]
    return Verdict(
        throughput=(served_a / duration_s, served_b / duration_s),
        p99_s=p99s,
        p99_diff_ci_s=ci,
        latency_p_value=latency_p,
        accuracy=acc,
        accuracy_p_value=accuracy_p,
        summary="; ".join(parts),
    )
