"""Guarded trials (``tuner.trial_guard``) and the SLO rule of the strategies: a trial that
breaks the SLO ends early, the job goes back on the incumbent, and configurations that batch
less than a breach are not proposed."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from tests.tuner import jobsim
from tests.tuner.test_loop import POLICY, RANKS, Loop, make_loop
from tuneloop.job_configs import latest_config
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import Job
from tuner.slo_breach import breach_reason
from tuner.space import IntParam, SearchSpace
from tuner.strategies.base import (
    REASON_OVERLOAD,
    REASON_WAIT,
    Observation,
    excluded_rule,
    slo_rule,
)
from tuner.strategies.bayesian import BayesianOptimization
from tuner.study_options import GuardPolicy, OptionsError, StudyOptions
from tuner.trial_guard import GUARD_REASON

FAST = [99.5, 0.5, 0.0]
"""Requests per second under 50 ms, under 200 ms, over: a P99 under the 100 ms SLO."""
SLOW = [80.0, 10.0, 10.0]
"""A tenth of the requests over 200 ms: the P99 breaks the SLO."""


def _latency(loop: Loop, start: float, end: float, rates: list[float]) -> None:
    jobsim.write_latency(
        loop.engine,
        loop.project_id,
        "train",
        start=loop.t0 + timedelta(seconds=start),
        end=loop.t0 + timedelta(seconds=end),
        bounds=[0.05, 0.2, math.inf],
        per_second=rates,
    )


def _measured_baseline(loop: Loop, at: float = -100.0) -> None:
    assert loop.step(at).action == "asked"
    loop.ack(1, at=at)
    assert loop.step(at + 1).action == "applied"
    loop.steps(at, at + 31, per_rank=50.0)
    _latency(loop, at, at + 31, FAST)
    assert loop.step(at + 31).detail == "complete"


def _desired(loop: Loop) -> tuple[int, dict[str, object], str]:
    with session_scope(session_factory(loop.engine)) as session:
        job = session.get(Job, loop.job_id)
        assert job is not None
        row = latest_config(session, job, "desired")
        assert row is not None
        return row.version, dict(row.config), row.origin


def _slo_loop(engine: Engine, guard: GuardPolicy | None = None) -> Loop:
    options = StudyOptions(measurement=POLICY, ranks=RANKS, slo_s=0.1, guard=guard or GuardPolicy())
    return make_loop(engine, objective="slo_throughput", options=options)


def test_a_trial_over_the_slo_ends_early_and_the_incumbent_comes_back(engine: Engine) -> None:
    loop = _slo_loop(engine)
    _measured_baseline(loop)
    baseline_config = loop.trials()[0].params
    assert loop.step(100).action == "asked"
    version, trial_config, _ = _desired(loop)
    assert trial_config != baseline_config
    loop.ack(version, at=100)
    assert loop.step(101).action == "applied"
    loop.steps(100, 106, per_rank=50.0)
    _latency(loop, 100, 106, FAST)
    # Within the SLO so far: the trial goes on.
    assert loop.step(104).action == "waiting"
    _latency(loop, 106, 108, [0.0, 0.0, 60.0])
    guarded = loop.step(108)
    assert guarded.action == "told" and guarded.detail.startswith(f"infeasible: {GUARD_REASON}")
    trial = loop.trials()[-1]
    assert trial.state == "infeasible" and trial.measurements["data"]["guard"]["elapsed_s"] == 8
    # The job is back on the incumbent (the baseline: the only feasible config measured) ...
    back, config, origin = _desired(loop)
    assert back == version + 1 and origin == "tuner-trial"
    assert {k: config[k] for k in baseline_config} == baseline_config
    entry = next(e for e in loop.audit() if e.action == "trial.guard")
    assert entry.details["desired_version"] == back and entry.details["incumbent"] == "trials [1]"
    # ... which runs hold_s (10 s) before the next trial.
    held = loop.step(112)
    assert held.action == "skip" and held.detail.startswith("holding the incumbent")
    assert loop.step(119).action == "asked"
    # A second guarded trial in a row: the hold doubles.
    version, _, _ = _desired(loop)
    loop.ack(version, at=119)
    assert loop.step(120).action == "applied"
    loop.steps(119, 124, per_rank=50.0)
    _latency(loop, 119, 124, SLOW)
    assert loop.step(124).detail.startswith(f"infeasible: {GUARD_REASON}")
    held = loop.step(140)
    assert held.action == "skip" and "2 guarded trial(s) in a row" in held.detail
    assert loop.step(145).action == "asked"


def test_no_trial_starts_without_headroom(engine: Engine) -> None:
    loop = _slo_loop(engine)
    _measured_baseline(loop)
    _latency(loop, 90, 100, [90.0, 10.0, 0.0])  # P99 between 50 and 200 ms: over 0.8 x SLO
    held = loop.step(100)
    assert held.action == "skip" and held.detail.startswith("no headroom to explore")
    _latency(loop, 100, 115, FAST)
    assert loop.step(115).action == "asked"


def test_the_guard_is_off_when_disabled(engine: Engine) -> None:
    loop = _slo_loop(engine, GuardPolicy(enabled=False))
    _measured_baseline(loop)
    assert loop.step(100).action == "asked"
    version, _, _ = _desired(loop)
    loop.ack(version, at=100)
    loop.step(101)
    loop.steps(100, 108, per_rank=50.0)
    _latency(loop, 100, 108, SLOW)
    assert loop.step(108).action == "waiting"


def test_the_pre_study_trial_is_not_guarded(engine: Engine) -> None:
    loop = _slo_loop(engine)
    loop.step(0)
    loop.ack(1, at=0)
    loop.step(1)
    loop.steps(0, 8, per_rank=50.0)
    _latency(loop, 0, 8, SLOW)
    assert loop.step(8).action == "waiting"


BATCHER = SearchSpace(
    [
        IntParam("max_batch_size", 1, 64, powers_of_two=True),
        IntParam("max_delay_ms", 1, 64, log=True),
    ]
)


def _breach(number: int, batch: int, delay: int, reason: str = REASON_OVERLOAD) -> Observation:
    config = {"max_batch_size": batch, "max_delay_ms": delay}
    return Observation(number, config, "infeasible", reason=f"{reason}: p99 0.3 s")


def test_an_overload_excludes_configs_that_batch_less() -> None:
    dominated = slo_rule(BATCHER, [_breach(1, 8, 5)])
    assert dominated({"max_batch_size": 4, "max_delay_ms": 5})
    assert dominated({"max_batch_size": 8, "max_delay_ms": 1})
    assert not dominated({"max_batch_size": 16, "max_delay_ms": 1})
    assert not dominated({"max_batch_size": 2, "max_delay_ms": 11})
    assert excluded_rule(BATCHER, [_breach(1, 8, 5)])({"max_batch_size": 2, "max_delay_ms": 2})


def test_a_wait_breach_excludes_configs_that_batch_more() -> None:
    dominated = slo_rule(BATCHER, [_breach(1, 32, 64, REASON_WAIT)])
    assert dominated({"max_batch_size": 64, "max_delay_ms": 64})
    assert not dominated({"max_batch_size": 64, "max_delay_ms": 40})
    assert not dominated({"max_batch_size": 2, "max_delay_ms": 2})


def test_other_breaches_exclude_nothing_more() -> None:
    for reason in ("slo: p99 latency", "failed: crash"):
        assert not slo_rule(BATCHER, [_breach(1, 8, 5, reason)])({"max_batch_size": 1})


def test_which_way_the_slo_broke_follows_the_batching_wait() -> None:
    verdict = "slo: p99 latency 0.3 s > SLO 0.15 s"
    quick = breach_reason(verdict, {"max_batch_size": 8, "max_delay_ms": 5}, 0.15)
    assert quick.startswith(REASON_OVERLOAD) and quick.endswith(verdict.removeprefix("slo: "))
    slow = breach_reason(verdict, {"max_batch_size": 8, "max_delay_ms": 40}, 0.15)
    assert slow.startswith(REASON_WAIT)
    assert breach_reason(verdict, {"batch_size": 8}, 0.15) == verdict


def test_the_bayesian_study_never_proposes_what_the_slo_rule_excludes() -> None:
    strategy = BayesianOptimization(BATCHER, seed=0)
    history = [_breach(1, 16, 20)]
    for number in range(2, 12):
        config = strategy.ask(history)
        assert config["max_batch_size"] > 16 or config["max_delay_ms"] > 20, config
        history.append(Observation(number, config, "complete", value=float(number)))


def test_guard_options_round_trip_and_bad_ones_are_refused() -> None:
    guard = GuardPolicy(p99_factor=1.5, after_s=2, hold_s=0, explore_below=0.5)
    options = StudyOptions(slo_s=0.15, guard=guard)
    assert StudyOptions.from_dict(options.to_dict()).guard == guard
    assert "guard" not in StudyOptions(slo_s=0.15).to_dict()  # the default reads back as before
    for bad in ({"p99_factor": 0}, {"hold_s": -1}, {"enabled": "yes"}, {"window": 3}):
        with pytest.raises(OptionsError, match="guard"):
            StudyOptions.from_dict({"guard": bad})
