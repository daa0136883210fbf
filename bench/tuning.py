"""Tuner benchmark: BO, the adaptive bandit (RL), random and grid search on measured problems.

The problems (``bench/tuning_problems.py``, whose docstring has the details) replay the real
DDP training runs of ``bench/data``: a 2-rank PyTorch DistributedDataParallel job on
scikit-learn's digits, measured over per-rank batch {2..256} x sync period {1..16} under five
conditions (``bench/data/README.md``). **Each trial draws one of the proposed configuration's
measured runs at random** (uniformly, with replacement) and tells the strategy that run's value:
speed to target (1 / time to 98% validation accuracy, 0 when not reached), goodput (the run's
throughput x Pollux efficiency at the condition's pooled noise scale) or raw throughput. The
noise a strategy sees is therefore the measured run-to-run noise (25-35% coefficient of
variation on the real loopback network); configurations that ran out of memory are infeasible
with reason ``oom``. The *truth* of a configuration, which every fraction below is computed on,
is the mean over its measured runs.

What is reported (``--seeds`` seeds, 20 by default; seed ``s`` seeds the strategy and, with the
problem and the trial number, the draw of the measured run):

1. **Static problems**: the median over seeds of the fraction of the optimum reached after 5,
   10, 15 and 20 trials (the truth of the best configuration tried so far / the optimum; an
   infeasible trial reaches 0), the number of seeds that reached 95% within 15 trials, and the
   median and mean simple regret at 15 trials (1 - fraction) of BO against random search.
   Also, for BO, the truth of its *recommendation* after 15 trials (the configuration with the
   best mean observed value), which pays for the noise in what it measured.
2. **Moving optimum** (``mem1m`` -> ``slownet_mem1m``: the same 1 MiB memory limit, the network
   slows; and ``baseline`` -> ``slownet`` for goodput on the full grid): 20 trials on the first
   problem, then 20 on the second. The bandit keeps its history (nothing tells it that
   anything changed); BO is restarted from scratch on the new problem, and so is random search
   for reference. Reported: trials after the change until a proposal reaches 95% of the new
   optimum (``--after`` + 1 when none does), and the share of the trials after the change that
   are within 95% (how well it settles, not just whether it passes by).
3. **Ask time** with 50 observations (20 distinct configurations of ``baseline/goodput``, 4 left
   untried so BO fits and maximizes its acquisition), a fresh strategy object per ask (as the
   store-backed service builds one), median of ``--ask-repeats`` asks per strategy interleaved
   in rotating order, and the ratio against random search's ask in the same run.
4. **Ranking**: Spearman's rho between the measured speed to target and goodput (the tuner's
   default objective, computed with ``tuner.objectives.goodput``), goodput online (only what the
   job's agent reported during the first second of each run) and raw throughput, over each
   condition's feasible configurations.

Deterministic given the seeds (the timings aside). Progress goes to stderr, the tables
(Markdown) to stdout. Usage, from the repository root::

    nice -n 10 .venv/bin/python bench/tuning.py            # 20 seeds, a few minutes on 2 cores
    nice -n 10 .venv/bin/python bench/tuning.py --quick    # 3 seeds: a smoke run
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import spearmanr
from tuning_problems import (  # the sibling module, as bench/otlp_ingest.py does
    Problem,
    config_label,
    moving_problems,
    ranking_inputs,
    static_problems,
)

from tuner.space import ParamValue
from tuner.strategies import BaseStrategy, Observation, SpaceExhausted, make_strategy
from tuner.strategies.bandit import AdaptiveBandit

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


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- running strategies


@dataclass(slots=True)
class Trace:
    """What one strategy did on one problem with one seed."""

    configs: list[dict[str, ParamValue]] = field(default_factory=list)
    history: list[Observation] = field(default_factory=list)
    exhausted: bool = False


def draw_rng(seed: int, problem: Problem, number: int) -> np.random.Generator:
    """The generator that picks trial ``number``'s measured run: the same for every strategy,
    so strategies that propose the same configuration at the same trial see the same run."""
    return np.random.default_rng([seed, problem.ident, number])


def run_trials(
    strategy: BaseStrategy,
    problem: Problem,
    seed: int,
    trials: int,
    history: list[Observation] | None = None,
) -> Trace:
    """``trials`` ask/evaluate rounds, appended to ``history`` (numbers continue from it)."""
    trace = Trace(history=list(history or []))
    for _ in range(trials):
        number = len(trace.history)
        try:
            config = strategy.ask(trace.history)
        except SpaceExhausted:
            trace.exhausted = True  # grid search on a space smaller than the budget
            break
        trace.configs.append(config)
        trace.history.append(problem.evaluate(config, number, draw_rng(seed, problem, number)))
    return trace


def reached(problem: Problem, configs: Sequence[Mapping[str, ParamValue]], n: int) -> float:
    """Fraction of the optimum of the best configuration among the first ``n`` tried."""
    return max((problem.fraction(c) for c in configs[:n]), default=0.0)


def recommended(problem: Problem, history: Sequence[Observation], n: int) -> float:
    """Fraction of the optimum of the configuration with the best mean observed value among
    the first ``n`` trials: what a user would keep running."""
    sums: dict[tuple[int, int], list[float]] = {}
    configs: dict[tuple[int, int], Mapping[str, ParamValue]] = {}
    for obs in history[:n]:
        if obs.state == "complete" and obs.value is not None:
            key = (int(obs.config["batch_size"]), int(obs.config["sync_period"]))
            sums.setdefault(key, []).append(obs.value)
            configs[key] = obs.config
    if not sums:
        return 0.0
    best = max(sums, key=lambda k: statistics.fmean(sums[k]))
    return problem.fraction(configs[best])


# ---------------------------------------------------------------------- one seed


@dataclass(slots=True)
class Settings:
    trials: int
    before: int
    after: int
    only: frozenset[str]

    def wanted(self, problem: Problem) -> bool:
        return not self.only or problem.name in self.only


@dataclass(slots=True)
class SeedResult:
    """Everything measured with one seed (plain data: it crosses process boundaries)."""

    seed: int
    reached: dict[tuple[str, str], list[float]]  # (problem, strategy) -> per checkpoint
    recommended_bo: dict[str, float]  # problem -> BO's recommendation at 15 trials
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


def run_seed(seed: int, settings: Settings) -> SeedResult:
    """Every static problem with every strategy, then every moving optimum, for one seed.
    Traces are shared: the first phase of a moving problem is the static run of the same
    problem (same draws), and BO from scratch on a static problem is its static run."""
    started = time.perf_counter()
    cache: dict[tuple[str, str, int], Trace] = {}

    def trace(name: str, problem: Problem, trials: int) -> Trace:
        key = (name, problem.name, trials)
        if key not in cache:
            strategy = make_strategy(name, problem.space, seed=seed)
            cache[key] = run_trials(strategy, problem, seed, trials)
        return cache[key]

    result = SeedResult(seed, {}, {}, {}, {}, {}, {}, 0.0)
    for problem in PROBLEMS:
        if not settings.wanted(problem):
            continue
        for label, name in STRATEGIES.items():
            done = trace(name, problem, settings.trials)
            result.reached[problem.name, label] = [
                reached(problem, done.configs, n) for n in CHECKPOINTS
            ]
            if label == "BO":
                result.recommended_bo[problem.name] = recommended(problem, done.history, 15)
            if name == "bandit":
                bandit = make_strategy(name, problem.space, seed=seed)
                assert isinstance(bandit, AdaptiveBandit)
                result.false_alarm[problem.name] = bandit.change_point(done.history) is not None
    for before, after in MOVES:
        if not (settings.wanted(before) or settings.wanted(after)):
            continue
        change = change_name(before, after)
        for label, (name, keep) in MOVING_LABELS.items():
            if keep:
                first = trace(name, before, settings.before)
                strategy = make_strategy(name, before.space, seed=seed)
                second = run_trials(strategy, after, seed, settings.after, first.history)
                configs = second.configs
                if name == "bandit":
                    last = first.configs[-10:]
                    result.settled_bandit[change] = sum(
                        before.fraction(c) >= TARGET for c in last
                    ) / len(last)
            else:
                configs = trace(name, after, settings.after).configs
            result.regain[change, label] = trials_to_target(after, configs)
            result.share_after[change, label] = sum(
                after.fraction(c) >= TARGET for c in configs
            ) / max(len(configs), 1)
    result.seconds = time.perf_counter() - started
    return result


def trials_to_target(problem: Problem, configs: Sequence[Mapping[str, ParamValue]]) -> int:
    """1-based index of the first configuration within 95% of the optimum; len + 1 if none."""
    for i, config in enumerate(configs, start=1):
        if problem.fraction(config) >= TARGET:
            return i
    return len(configs) + 1


PROBLEMS: list[Problem] = []
MOVES: list[tuple[Problem, Problem]] = []


def load_problems() -> None:
    """Build the problems once per process (the pool's initializer, and the parent)."""
    if not PROBLEMS:
        PROBLEMS.extend(static_problems())
        MOVES.extend(moving_problems())


def _worker(task: tuple[int, Settings]) -> SeedResult:
    load_problems()
    return run_seed(*task)


# ---------------------------------------------------------------------- ask time


def timing_history(problem: Problem, distinct: int, total: int) -> list[Observation]:
    """``total`` observations cycling over ``distinct`` feasible configurations (seeded)."""
    rng = np.random.default_rng(0)
    feasible = [c for c in problem.space.grid(None) if problem.measured(c).feasible]
    chosen = [feasible[i] for i in rng.choice(len(feasible), size=distinct, replace=False)]
    return [problem.evaluate(chosen[n % distinct], n, rng) for n in range(total)]


def time_asks(problem: Problem, repeats: int) -> dict[str, float]:
    """Median seconds of one ask with 50 observations, per strategy, interleaved."""
    history = timing_history(problem, distinct=20, total=50)
    samples: dict[str, list[float]] = {label: [] for label in STRATEGIES}
    labels = list(STRATEGIES)
    for r in range(repeats):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            strategy = make_strategy(STRATEGIES[label], problem.space, seed=r)
            started = time.perf_counter()
            strategy.ask(history)
            samples[label].append(time.perf_counter() - started)
    return {label: statistics.median(v) for label, v in samples.items()}


# ---------------------------------------------------------------------- report


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


def print_static(results: Sequence[SeedResult]) -> None:
    seeds = len(results)
    names = list(dict.fromkeys(p for p, _ in results[0].reached))
    problems = {p.name: p for p in PROBLEMS}
    print(f"\n### Static problems: median fraction of the optimum reached ({seeds} seeds)\n")
    print("| problem | optimum | strategy | 5 | 10 | 15 | 20 | seeds >= 95% by 15 |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        p = problems[name]
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
        "| BO's recommendation at 15, median fraction |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    halved = reach = positive = strict = 0
    for name in names:
        bo = [1 - r.reached[name, "BO"][2] for r in results]
        rnd = [1 - r.reached[name, "random"][2] for r in results]
        bo_med, rnd_med = _median(bo), _median(rnd)
        halved += bo_med <= rnd_med / 2
        positive += rnd_med > 0
        strict += rnd_med > 0 and bo_med <= rnd_med / 2
        reach += 1 - bo_med >= TARGET
        recommendation = _median([r.recommended_bo[name] for r in results])
        print(
            f"| `{name}` | {bo_med:.3f} | {rnd_med:.3f} | {statistics.fmean(bo):.3f} | "
            f"{statistics.fmean(rnd):.3f} | "
            f"{_fmt_ratio(statistics.fmean(bo), statistics.fmean(rnd))} | {recommendation:.3f} |"
        )
    print(
        f"\nTargets: BO's median fraction at 15 trials >= 95% on {reach}/{len(names)} problems; "
        f"BO's median regret at 15 <= half of random search's on {halved}/{len(names)} "
        f"(0 <= 0 counts as met; {strict}/{positive} where random's median is above 0)."
    )


def print_moving(results: Sequence[SeedResult], after: int) -> None:
    seeds = len(results)
    changes = list(dict.fromkeys(c for c, _ in results[0].regain))
    if not changes:
        return
    moves = {change_name(a, b): (a, b) for a, b in MOVES}
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
        before, later = moves[change]
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


# ---------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=20, help="trials per static run")
    parser.add_argument("--before", type=int, default=20, help="trials before the change")
    parser.add_argument("--after", type=int, default=20, help="trials after the change")
    parser.add_argument("--ask-repeats", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="3 seeds, fewer asks timed")
    parser.add_argument("--only", default="", help="comma-separated problem names")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.ask_repeats = 3, 5
    if args.before > args.trials:
        parser.error("--before must be at most --trials (it reuses the static runs)")
    settings = Settings(
        args.trials, args.before, args.after, frozenset(filter(None, args.only.split(",")))
    )

    started = time.perf_counter()
    load_problems()
    progress(
        f"{len(PROBLEMS)} static problems x {len(STRATEGIES)} strategies, {len(MOVES)} moving "
        f"optima, {args.seeds} seeds on {args.jobs} processes"
    )
    tasks = [(seed, settings) for seed in range(args.seeds)]
    results: list[SeedResult] = []
    with multiprocessing.get_context("spawn").Pool(args.jobs, initializer=load_problems) as pool:
        for result in pool.imap(_worker, tasks):
            results.append(result)
            progress(
                f"  seed {result.seed + 1}/{args.seeds} done in {result.seconds:.1f} s "
                f"({time.perf_counter() - started:.0f} s elapsed)"
            )
    progress("ask timing")
    timings = time_asks(next(p for p in PROBLEMS if p.name == "baseline/goodput"), args.ask_repeats)
    elapsed = time.perf_counter() - started

    print(f"Machine: {machine()}.\n")
    print(f"Wall time {elapsed:.0f} s on {args.jobs} processes.")
    print_static(results)
    print_moving(results, args.after)
    print_asks(timings, args.ask_repeats)
    print_ranking()


if __name__ == "__main__":
    main()
