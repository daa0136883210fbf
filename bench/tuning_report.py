"""The tuner benchmark's labels, per-seed results and Markdown report (``bench/tuning.py``)."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import spearmanr
from tuning_problems import Problem, config_label, ranking_inputs

STRATEGIES: dict[str, str] = {
    "BO": "bayesian",
    "RL (bandit)": "bandit",
    "random": "random",
    "grid": "grid",
}
"""Report label -> registry name."""

CHECKPOINTS = (5, 10, 15, 20)
TARGET = 0.95
CONDITIONS = ("baseline", "slownet", "memlimit", "mem1m", "slownet_mem1m")


@dataclass(slots=True)
class SeedResult:
    """Everything measured with one seed (plain data: it crosses process boundaries)."""

    seed: int
    reached: dict[tuple[str, str], list[float]]  # (problem, strategy) -> per checkpoint
    recommended_bo: dict[str, tuple[float, float]]  # problem -> BO's keep at 15, z = 1 and 0
    regain: dict[tuple[str, str], int]  # (change, strategy) -> trials to 95% after it
    share_after: dict[tuple[str, str], float]  # (change, strategy) -> share of trials >= 95%
    settled_bandit: dict[str, float]  # change -> bandit's share >= 95% in its last 10 before
    false_alarm: dict[str, bool]  # static problem -> the bandit detected a change that is not
    seconds: float


MOVING_LABELS: dict[str, tuple[str, bool]] = {
    "RL (bandit), continuing": ("bandit", True),
    "BO from scratch": ("bayesian", False),
    "random from scratch": ("random", False),
}
"""Moving-optimum contenders: registry name, and whether the history before the change is kept."""


def change_name(before: Problem, after: Problem) -> str:
    return f"{before.name} -> {after.name}"


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _fmt_ratio(numerator: float, denominator: float) -> str:
    if denominator == 0:
        return "0 / 0" if numerator == 0 else "inf"
    return f"{numerator / denominator:.2f}"


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    import scipy
    import skopt

    return (
        f"`nproc` = {os.cpu_count()}, {model}, Python {platform.python_version()}, "
        f"numpy {np.__version__}, scipy {scipy.__version__}, scikit-optimize {skopt.__version__}; "
        f"load average at the end {load}"
    )


def print_static(results: Sequence[SeedResult], problems: Sequence[Problem]) -> None:
    seeds = len(results)
    names = list(dict.fromkeys(p for p, _ in results[0].reached))
    by_name = {p.name: p for p in problems}
    print(f"\n### Static problems: median fraction of the optimum reached ({seeds} seeds)\n")
    print("| problem | optimum | strategy | 5 | 10 | 15 | 20 | seeds >= 95% by 15 |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        p = by_name[name]
        for i, label in enumerate(STRATEGIES):
            rows = [r.reached[name, label] for r in results]
            cells = [f"{_median([r[j] for r in rows]):.3f}" for j in range(len(CHECKPOINTS))]
            hits = sum(r[2] >= TARGET for r in rows)
            first = f"`{name}`" if i == 0 else ""
            best = f"{config_label(p.best)} {p.optimum:.4g}" if i == 0 else ""
            print(f"| {first} | {best} | {label} | {' | '.join(cells)} | {hits}/{seeds} |")
    alarms = ", ".join(f"`{name}` {sum(r.false_alarm[name] for r in results)}" for name in names)
    print(
        f"\nThe bandit's change test where nothing changes: seeds (of {seeds}) in which it "
        f"detected a change in its static run: {alarms}."
    )

    print(f"\n### Simple regret at 15 trials, BO vs random search ({seeds} seeds)\n")
    print(
        "| problem | BO median | random median | BO mean | random mean | BO / random (mean) "
        "| BO's recommendation at 15: median (mean) fraction | same, z = 0 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    halved = reach = positive = strict = 0
    for name in names:
        bo = [1 - r.reached[name, "BO"][2] for r in results]
        rnd = [1 - r.reached[name, "random"][2] for r in results]
        bo_med, rnd_med = _median(bo), _median(rnd)
        halved += bo_med <= rnd_med / 2
        positive += rnd_med > 0
        strict += rnd_med > 0 and bo_med <= rnd_med / 2
        reach += 1 - bo_med >= TARGET
        kept = [[r.recommended_bo[name][i] for r in results] for i in range(2)]  # z = 1, z = 0
        cells = [f"{_median(k):.3f} ({statistics.fmean(k):.3f})" for k in kept]
        print(
            f"| `{name}` | {bo_med:.3f} | {rnd_med:.3f} | {statistics.fmean(bo):.3f} | "
            f"{statistics.fmean(rnd):.3f} | "
            f"{_fmt_ratio(statistics.fmean(bo), statistics.fmean(rnd))} | {' | '.join(cells)} |"
        )
    print(
        f"\nTargets: BO's median fraction at 15 trials >= 95% on {reach}/{len(names)} problems; "
        f"BO's median regret at 15 <= half of random search's on {halved}/{len(names)} "
        f"(0 <= 0 counts as met; {strict}/{positive} where random's median is above 0)."
    )


def print_moving(
    results: Sequence[SeedResult], moves: Sequence[tuple[Problem, Problem]], after: int
) -> None:
    seeds = len(results)
    changes = list(dict.fromkeys(c for c, _ in results[0].regain))
    if not changes:
        return
    by_change = {change_name(a, b): (a, b) for a, b in moves}
    print(
        f"\n### Moving optimum: trials after the change until a proposal reaches 95% of the new "
        f"optimum ({seeds} seeds; {after + 1} = not within {after})\n"
    )
    print(
        "| change | optimum | "
        + " | ".join(f"{label}: median (mean)" for label in MOVING_LABELS)
        + " | bandit >= 95% before the change |"
    )
    print("|---|---|" + "---:|" * (len(MOVING_LABELS) + 1))
    for change in changes:
        before, later = by_change[change]
        cells = []
        for label in MOVING_LABELS:
            values = [r.regain[change, label] for r in results]
            cells.append(f"{_median(values):g} ({statistics.fmean(values):.1f})")
        settled = statistics.fmean(r.settled_bandit[change] for r in results)
        print(
            f"| `{change}` | {config_label(before.best)} -> {config_label(later.best)} | "
            + " | ".join(cells)
            + f" | {settled:.0%} of its last 10 trials |"
        )
    print(f"\nShare of the {after} trials after the change within 95% of the new optimum (mean):\n")
    print("| change | " + " | ".join(MOVING_LABELS) + " |")
    print("|---|" + "---:|" * len(MOVING_LABELS))
    for change in changes:
        cells = [
            f"{statistics.fmean(r.share_after[change, label] for r in results):.0%}"
            for label in MOVING_LABELS
        ]
        print(f"| `{change}` | " + " | ".join(cells) + " |")


def print_asks(timings: Mapping[str, float], repeats: int) -> None:
    print(
        f"\n### One ask with 50 observations (20 distinct configurations, fresh strategy, "
        f"median of {repeats})\n"
    )
    print("| strategy | ms | ratio to random search's ask |")
    print("|---|---:|---:|")
    base = timings["random"]
    for label, seconds in timings.items():
        print(f"| {label} | {seconds * 1000:.2f} | {seconds / base:.1f} |")


def print_ranking() -> None:
    print("\n### Does goodput rank configurations like the measured time to target?\n")
    print(
        "Spearman's rho against the measured speed to target (1 / time to target), over each "
        "condition's feasible configurations; last column: speed to target of the goodput "
        "optimum as a fraction of the best.\n"
    )
    print(
        "| condition | configs | goodput | goodput online (first 1 s) | raw throughput "
        "| speed of goodput's argmax / best |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for condition in CONDITIONS:
        data = ranking_inputs(condition)
        speed = data["speed"]
        rho = {k: float(spearmanr(speed, data[k])[0]) for k in ("goodput", "goodput_online")}
        rho["throughput"] = float(spearmanr(speed, data["throughput"])[0])
        argmax = int(np.argmax(data["goodput"]))
        print(
            f"| `{condition}` | {len(speed)} | **{rho['goodput']:.3f}** | "
            f"{rho['goodput_online']:.3f} | {rho['throughput']:.3f} | "
            f"{speed[argmax] / max(speed):.3f} |"
        )
