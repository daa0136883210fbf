"""The tuning problems of bench/tuning.py: built from the measured runs, nothing invented."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tuning import reached, recommended, trials_to_target
from tuning_problems import (
    DATA_DIR,
    RANKS,
    ProblemError,
    build_problem,
    load_condition,
    moving_problems,
    ranking_inputs,
    static_problems,
)

from tuner.strategies import Observation


@pytest.fixture(scope="module")
def problems() -> dict[str, object]:
    built = {p.name: p for p in static_problems()}
    for before, after in moving_problems():
        built.setdefault(before.name, before)
        built.setdefault(after.name, after)
    return built


def test_suite_has_the_problems_the_benchmark_promises(problems: dict[str, object]) -> None:
    names = set(problems)
    assert len(static_problems()) >= 6
    assert {"baseline/ttt", "memlimit/ttt", "baseline/goodput", "baseline/throughput"} <= names
    pairs = [(a.name, b.name) for a, b in moving_problems()]
    assert ("mem1m/goodput", "slownet_mem1m/goodput") in pairs


@pytest.mark.parametrize("condition", ["baseline", "memlimit", "slownet_mem1m"])
def test_truth_is_the_mean_of_the_measured_runs(condition: str) -> None:
    doc = load_condition(condition)
    speed = build_problem("s", condition, "speed", "")
    good = build_problem("g", condition, "goodput", "")
    thr = build_problem("t", condition, "throughput", "")
    for row in doc["configs"]:
        config = {"batch_size": row["batch"], "sync_period": row["sync_period"]}
        if not row["feasible"]:
            assert speed.truth(config) is None and good.truth(config) is None
            assert speed.fraction(config) == 0.0
            continue
        assert speed.truth(config) == pytest.approx(row["speed_to_target_mean"])
        assert good.truth(config) == pytest.approx(row["goodput_pooled_phi"])
        assert thr.truth(config) == pytest.approx(row["throughput_mean"])
    best = doc["analysis"]["optimum"]
    assert (speed.best.batch_size, speed.best.sync_period) == (best["batch"], best["sync_period"])
    assert speed.optimum == pytest.approx(best["speed_to_target_mean"])


def test_space_is_the_measured_grid_with_the_jobs_learning_rate() -> None:
    problem = build_problem("b", "baseline", "speed", "")
    assert problem.space.grid_size(None) == 40
    for run in load_condition("baseline")["runs"]:
        config = {"batch_size": run["spec"]["batch"], "sync_period": run["spec"]["sync_period"]}
        assert problem.space.apply_lr_rule(config, ranks=RANKS) == pytest.approx(run["lr"])
        assert problem.space.effective_batch(config, RANKS) == run["effective_batch"]


def test_an_evaluation_replays_one_measured_run() -> None:
    problem = build_problem("b", "baseline", "speed", "")
    by_config: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for run in load_condition("baseline")["runs"]:
        by_config.setdefault((run["spec"]["batch"], run["spec"]["sync_period"]), []).append(run)
    # A config where some runs reached the target and some did not.
    (batch, period), runs = next(
        (key, runs)
        for key, runs in sorted(by_config.items())
        if {r["status"] for r in runs} == {"reached", "not_reached"}
    )
    config = {"batch_size": batch, "sync_period": period}
    measured = sorted(1 / r["time_to_target_s"] if r["time_to_target_s"] else 0.0 for r in runs)
    draws = [problem.evaluate(config, n, np.random.default_rng([0, n])).value for n in range(200)]
    assert sorted(set(draws)) == pytest.approx(sorted(set(measured)))
    assert 0.0 in draws  # a run that never reached the target is speed 0, not a guess
    again = [problem.evaluate(config, n, np.random.default_rng([0, n])).value for n in range(20)]
    assert again == draws[:20]
    # Each draw is told with the noise of one run of its configuration: its runs' spread.
    told = problem.evaluate(config, 0, np.random.default_rng([0, 0]))
    assert told.stderr == pytest.approx(float(np.std(measured, ddof=1)))
    bare = problem.evaluate(config, 0, np.random.default_rng([0, 0]), with_stderr=False)
    assert bare.stderr is None and bare.value == told.value


def test_out_of_memory_configs_are_infeasible_with_reason_oom() -> None:
    problem = build_problem("m", "mem1m", "goodput", "")
    obs = problem.evaluate({"batch_size": 32, "sync_period": 1}, 3, np.random.default_rng(0))
    assert (obs.state, obs.reason, obs.value) == ("infeasible", "oom", None)
    assert "out of memory" in problem.measured({"batch_size": 64, "sync_period": 8}).error
    assert sum(c.feasible for c in problem.configs.values()) == 20  # b <= 16


def test_bad_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ProblemError, match="unknown objective"):
        build_problem("x", "baseline", "loss", "")  # type: ignore[arg-type]
    with pytest.raises(ProblemError, match="no measurements"):
        build_problem("x", "nosuch", "speed", "", data_dir=tmp_path)
    doc = json.loads((DATA_DIR / "ddp_digits_mem1m.json").read_text())
    oom = next(r for r in doc["runs"] if r["status"] == "oom")
    fine = next(r for r in doc["runs"] if r["status"] == "reached")
    doc["runs"].append({**fine, "spec": oom["spec"]})  # the same config both fits and not
    (tmp_path / "ddp_digits_mem1m.json").write_text(json.dumps(doc))
    with pytest.raises(ProblemError, match="OOM in only some runs"):
        build_problem("x", "mem1m", "speed", "", data_dir=tmp_path)
    shutil.copy(DATA_DIR / "ddp_digits_baseline.json", tmp_path / "ddp_digits_cut.json")
    cut = json.loads((tmp_path / "ddp_digits_cut.json").read_text())
    cut["runs"] = [r for r in cut["runs"] if r["spec"]["batch"] != 128]
    (tmp_path / "ddp_digits_cut.json").write_text(json.dumps(cut))
    with pytest.raises(ProblemError, match="no measured runs"):
        build_problem("x", "cut", "speed", "", data_dir=tmp_path)


def test_ranking_inputs_reproduce_the_measured_correlations() -> None:
    from scipy.stats import spearmanr

    for condition in ("baseline", "slownet_mem1m"):
        data = ranking_inputs(condition)
        rho = load_condition(condition)["analysis"]["spearman_vs_speed_to_target"]
        assert spearmanr(data["speed"], data["goodput"])[0] == pytest.approx(
            rho["goodput_pooled_phi"]
        )
        assert spearmanr(data["speed"], data["goodput_online"])[0] == pytest.approx(
            rho["goodput_online"]
        )
        assert spearmanr(data["speed"], data["throughput"])[0] == pytest.approx(
            rho["throughput_only"]
        )


def test_scores_of_a_trace() -> None:
    problem = build_problem("b", "baseline", "speed", "")
    ranked = sorted(
        (c for c in problem.configs.values() if c.feasible), key=lambda c: -(c.truth or 0.0)
    )
    best, second = ({"batch_size": c.batch_size, "sync_period": c.sync_period} for c in ranked[:2])
    worst = {"batch_size": 256, "sync_period": 16}  # never reached the target: 0
    assert problem.truth(worst) == 0.0
    configs = [worst, second, best]
    assert reached(problem, configs, 1) == 0.0
    assert reached(problem, configs, 2) == pytest.approx(ranked[1].truth / ranked[0].truth)
    assert reached(problem, configs, 3) == 1.0
    assert trials_to_target(problem, configs) == (2 if reached(problem, configs, 2) >= 0.95 else 3)
    assert trials_to_target(problem, [worst]) == 2  # len + 1: not reached
    # The recommendation is the best *observed* mean: a lucky draw of a worse config wins.
    history = [
        Observation(0, best, "complete", value=0.9),
        Observation(1, second, "complete", value=99.0),
        Observation(2, worst, "infeasible", reason="oom"),
    ]
    assert recommended(problem, history, 3) == pytest.approx(problem.fraction(second))
    assert recommended(problem, [], 3) == 0.0
    # Told with their noise, a lucky draw far outside its error bar no longer wins alone.
    noisy = [
        Observation(0, best, "complete", value=2.0, stderr=0.1),
        Observation(1, second, "complete", value=2.5, stderr=2.0),
    ]
    assert recommended(problem, noisy, 2) == pytest.approx(1.0)
    assert recommended(problem, noisy, 2, z=0.0) == pytest.approx(problem.fraction(second))
    assert math.isclose(problem.fraction(best), 1.0)
