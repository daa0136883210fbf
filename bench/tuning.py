"""Tuner benchmark: BO, the adaptive bandit (RL), random and grid search on measured problems.

The problems (``bench/tuning_problems.py``, whose docstring has the details) replay the real
DDP training runs of ``bench/data``: a 2-rank PyTorch DistributedDataParallel job on
scikit-learn's digits, measured over per-rank batch {2..256} x sync period {1..16} under five
conditions (``bench/data/README.md``). **Each trial draws one of the proposed configuration's
measured runs at random** (uniformly, with replacement) and tells the strategy that run's value:
speed to target (1 / time to 98% validation accuracy, 0 when not reached), goodput (the run's
throughput x Pollux efficiency at the condition's pooled noise scale) or raw throughput, with
the standard deviation of the configuration's runs as its stderr (``--without-stderr``: none,
as before the tuner weighed noise). The noise a strategy sees is therefore the measured
run-to-run noise (25-35% coefficient of variation on the real loopback network, 0-170% per
configuration); configurations that ran out of memory are infeasible with reason ``oom``. The
*truth* of a configuration, which every fraction below is computed on, is the mean over its
measured runs.

What is reported (``--seeds`` seeds, 20 by default; seed ``s`` seeds the strategy and, with the
problem and the trial number, the draw of the measured run):

1. **Static problems**: the median over seeds of the fraction of the optimum reached after 5,
   10, 15 and 20 trials (the truth of the best configuration tried so far / the optimum; an
   infeasible trial reaches 0), the number of seeds that reached 95% within 15 trials, and the
   median and mean simple regret at 15 trials (1 - fraction) of BO against random search.
   Also, for BO, the truth of its *recommendation* after 15 trials (the configuration
   ``tuner.strategies.best_estimate`` keeps: repeats pooled, ranked one standard error below
   their value; and with z = 0, their pooled value), which pays for the noise in what it
   measured.
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
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from tuning_problems import (  # the sibling modules, as bench/otlp_ingest.py does
    Problem,
    moving_problems,
    static_problems,
)
from tuning_report import (
    CHECKPOINTS,
    MOVING_LABELS,
    STRATEGIES,
    TARGET,
    SeedResult,
    change_name,
    machine,
    print_asks,
    print_moving,
    print_ranking,
    print_static,
)

from tuner.space import ParamValue
from tuner.strategies import (
    BaseStrategy,
    Observation,
    SpaceExhausted,
    best_estimate,
    make_strategy,
)
from tuner.strategies.bandit import AdaptiveBandit


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
    *,
    with_stderr: bool = True,
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
        rng = draw_rng(seed, problem, number)
        trace.history.append(problem.evaluate(config, number, rng, with_stderr=with_stderr))
    return trace


def reached(problem: Problem, configs: Sequence[Mapping[str, ParamValue]], n: int) -> float:
    """Fraction of the optimum of the best configuration among the first ``n`` tried."""
    return max((problem.fraction(c) for c in configs[:n]), default=0.0)


def recommended(problem: Problem, history: Sequence[Observation], n: int, z: float = 1.0) -> float:
    """Fraction of the optimum of the configuration the study would keep after ``n`` trials
    (``best_estimate``: repeats pooled, ranked ``z`` standard errors below their value)."""
    best = best_estimate(history[:n], "maximize", z=z)
    return 0.0 if best is None else problem.fraction(best.config)


# ---------------------------------------------------------------------- one seed


@dataclass(slots=True)
class Settings:
    trials: int
    before: int
    after: int
    only: frozenset[str]
    with_stderr: bool = True
    """Tell each draw's noise as its stderr (``--without-stderr``: tell the value alone)."""

    def wanted(self, problem: Problem) -> bool:
        return not self.only or problem.name in self.only


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
            cache[key] = run_trials(
                strategy, problem, seed, trials, with_stderr=settings.with_stderr
            )
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
                result.recommended_bo[problem.name] = (
                    recommended(problem, done.history, 15, z=1.0),
                    recommended(problem, done.history, 15, z=0.0),
                )
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
                second = run_trials(
                    strategy,
                    after,
                    seed,
                    settings.after,
                    first.history,
                    with_stderr=settings.with_stderr,
                )
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
    parser.add_argument(
        "--without-stderr", action="store_true", help="tell values without their noise"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.ask_repeats = 3, 5
    if args.before > args.trials:
        parser.error("--before must be at most --trials (it reuses the static runs)")
    settings = Settings(
        args.trials,
        args.before,
        args.after,
        frozenset(filter(None, args.only.split(","))),
        with_stderr=not args.without_stderr,
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
    told = "with" if settings.with_stderr else "without"
    print(f"Wall time {elapsed:.0f} s on {args.jobs} processes; values told {told} stderr.")
    print_static(results, PROBLEMS)
    print_moving(results, MOVES, args.after)
    print_asks(timings, args.ask_repeats)
    print_ranking()


if __name__ == "__main__":
    main()
