"""The tuning loop on SQLite and PostgreSQL, with the job side simulated in the store and the
clock passed in (no waiting)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select

from tests.tuner import jobsim
from tuneloop.job_configs import study_outcome_source, study_trial_source
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import AuditEntry, Job, Trial
from tuneloop.storage.types import utcnow
from tuner import service
from tuner.loop import StepResult, reconcile_study
from tuner.measurement import MeasurementPolicy
from tuner.objectives import goodput
from tuner.space import SearchSpace
from tuner.study_options import StudyOptions

SPACE = SearchSpace.training((8, 64), (1, 2), sync_powers_of_two=True, base_lr=0.1, base_batch=32)
POLICY = MeasurementPolicy(
    warmup_s=10, window_s=20, min_samples=8, max_rel_stderr=0.02, max_age_s=30, max_extensions=2
)
RANKS = 2
PHI = 500.0


@dataclass
class Loop:
    engine: Engine
    study_id: int
    job_id: int
    project_id: int
    t0: datetime
    """An hour ago: simulated time runs from here, so no test waits."""

    def step(self, at: float) -> StepResult:
        with session_scope(session_factory(self.engine)) as session:
            return reconcile_study(session, self.study_id, now=self.t0 + timedelta(seconds=at))

    def trials(self) -> list[Trial]:
        with session_scope(session_factory(self.engine)) as session:
            rows = session.scalars(
                select(Trial).where(Trial.study_id == self.study_id).order_by(Trial.number)
            ).all()
            session.expunge_all()
            return list(rows)

    def ack(self, version: int, at: float, **kwargs: Any) -> None:
        jobsim.report(
            self.engine, self.job_id, version, at=self.t0 + timedelta(seconds=at), **kwargs
        )

    def steps(self, start: float, end: float, per_rank: float, **kwargs: Any) -> None:
        jobsim.write_steps(
            self.engine,
            self.project_id,
            "train",
            start=self.t0 + timedelta(seconds=start),
            end=self.t0 + timedelta(seconds=end),
            per_rank=per_rank,
            ranks=RANKS,
            **kwargs,
        )

    def run_baseline(self, at: float = -100.0, per_rank: float = 100.0) -> Trial:
        """Measure the study's first trial, the job's pre-study config (desired version 1)."""
        asked = self.step(at)
        assert asked.action == "asked" and asked.detail == "pre-study desired version 1", asked
        self.ack(1, at=at)
        assert self.step(at + 1).action == "applied"
        self.steps(at, at + 31, per_rank=per_rank, noise_scale=PHI)
        assert self.step(at + 31).detail == "complete"
        return self.trials()[-1]

    def audit(self) -> list[AuditEntry]:
        with session_scope(session_factory(self.engine)) as session:
            rows = session.scalars(select(AuditEntry).order_by(AuditEntry.id)).all()
            session.expunge_all()
            return list(rows)


def make_loop(
    engine: Engine,
    *,
    objective: str = "goodput",
    options: StudyOptions | None = None,
    strategy: str = "random",
) -> Loop:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session)
        study = service.create_study(
            session,
            job,
            name="s",
            objective=objective,
            space=SPACE,
            strategy=strategy,
            seed=3,
            options=options or StudyOptions(measurement=POLICY, ranks=RANKS),
        )
        return Loop(engine, study.id, job.id, job.project_id, utcnow() - timedelta(hours=1))


@pytest.fixture
def loop(engine: Engine) -> Iterator[Loop]:
    yield make_loop(engine)


def test_a_trial_goes_from_proposal_to_value(loop: Loop) -> None:
    baseline = loop.run_baseline()
    assert baseline.baseline and baseline.params == {**jobsim.START_CONFIG}
    assert baseline.value == pytest.approx(goodput(200.0, 64, PHI, 32), rel=0.01)
    assert [r.version for r in jobsim.desired(loop.engine, loop.job_id)] == [1], "nothing new"

    first = loop.step(0)
    assert (first.action, first.trial) == ("asked", 2)
    trial = loop.trials()[-1]
    assert trial.state == "running" and trial.desired_version == 2 and not trial.baseline
    row = jobsim.desired(loop.engine, loop.job_id)[-1]
    assert row.source == study_trial_source(loop.study_id)
    assert row.config == trial.params
    assert "learning_rate" in row.config, "a batch change travels with its learning rate"

    assert loop.step(1).action == "awaiting_ack"
    assert loop.step(2).action == "awaiting_ack", "a repeated pass changes nothing"
    assert len(loop.trials()) == 2

    loop.ack(2, at=5)
    applied = loop.step(6)
    assert applied.action == "applied"
    assert loop.trials()[-1].applied_at == loop.t0 + timedelta(seconds=5)
    assert loop.step(20).action == "waiting"  # warm-up 10 s + window 20 s after t=5

    loop.steps(5, 36, per_rank=100.0, noise_scale=PHI)
    told = loop.step(36)
    assert told.action == "told" and told.detail == "complete"
    done = loop.trials()[-1]
    config = {k: v for k, v in done.params.items() if k != "learning_rate"}
    effective = config["batch_size"] * RANKS * config["sync_period"]
    expected = goodput(2 * 100.0, effective, PHI, 32)
    assert done.value == pytest.approx(expected, rel=0.01)
    data = done.measurements["data"]
    assert data["inputs"]["noise_scale"] == pytest.approx(PHI)
    assert data["inputs"]["throughput_samples_s"] == pytest.approx(200.0, rel=0.01)
    assert data["stats"]["n"] >= 8
    assert done.value is not None and 0 < done.measurements["stderr"] < 0.02 * done.value

    nxt = loop.step(37)
    assert (nxt.action, nxt.trial) == ("asked", 3)
    versions = [r.version for r in jobsim.desired(loop.engine, loop.job_id)]
    assert versions == [1, 2, 3]
    actions = [e.action for e in loop.audit()]
    assert actions == [
        "study.create",
        "trial.baseline",
        "trial.applied",
        "trial.tell",
        "trial.ask",
        "trial.apply",
        "trial.applied",
        "trial.tell",
        "trial.ask",
        "trial.apply",
    ]


def test_noisy_measurements_extend_then_are_accepted_with_their_stderr(loop: Loop) -> None:
    loop.step(0)
    loop.ack(1, at=0)
    loop.step(1)
    loop.steps(0, 30, per_rank=100.0, wobble=0.5, noise_scale=PHI)
    extended = loop.step(30)
    assert extended.action == "extended" and "noise too high" in extended.detail
    assert loop.step(40).action == "waiting", "the window grew by window_s"
    loop.steps(30, 50, per_rank=100.0, wobble=0.5, noise_scale=PHI)
    assert loop.step(50).action == "extended"
    loop.steps(50, 70, per_rank=100.0, wobble=0.5, noise_scale=PHI)
    # The budget (warm-up + 3 windows) is spent: the value counts, with its error bar.
    told = loop.step(70)
    assert (told.action, told.detail) == ("told", "complete")
    [trial] = loop.trials()
    assert trial.state == "complete" and trial.value is not None
    assert trial.extensions == 2
    assert trial.measurements["stderr"] > POLICY.max_rel_stderr * trial.value
    assert trial.measurements["data"]["noisy"] is True
    assert "budget" in trial.measurements["data"]["verdict"]
    extends = [e for e in loop.audit() if e.action == "trial.extend"]
    assert len(extends) == 2 and "noise too high" in extends[0].details["reason"]


def test_stale_or_missing_data_waits_and_fails_with_its_reason(loop: Loop) -> None:
    loop.step(0)
    loop.ack(1, at=0)
    loop.step(1)
    # Samples that stop at t=10, before the warm-up ends: stale, never a value.
    loop.steps(0, 10, per_rank=100.0, noise_scale=PHI)
    assert loop.step(30).detail.startswith("stale")
    # Throughput arrives, but the agent never reports a noise scale: goodput is missing.
    loop.steps(30, 70, per_rank=100.0)
    missing = loop.step(50)
    assert missing.action == "extended" and "no noise_scale" in missing.detail
    failed = loop.step(70)
    assert failed.detail == "failed: gave up after 2 extensions: goodput: no noise_scale"
    assert loop.trials()[0].value is None


def test_oom_report_makes_the_trial_infeasible_and_the_next_one_starts(loop: Loop) -> None:
    loop.step(0)
    loop.ack(1, at=3, status="oom", reason="CUDA out of memory")
    told = loop.step(4)
    assert told.detail == "infeasible: oom"
    [trial] = loop.trials()
    assert trial.state == "infeasible" and trial.measurements["reason"] == "oom"
    assert trial.measurements["data"]["detail"] == "CUDA out of memory"
    after = loop.step(5)
    if trial.params["batch_size"] == 8:  # every batch >= 8 would run out of memory too
        assert after.action == "completed" and "nothing left to try" in after.detail
    else:
        assert after.action == "asked"
        assert loop.trials()[1].params["batch_size"] < trial.params["batch_size"]


def test_a_failure_report_and_a_failed_job(engine: Engine) -> None:
    loop = make_loop(engine)
    loop.step(0)
    loop.ack(1, at=1, status="failed", reason="NCCL timeout")
    assert loop.step(2).detail == "infeasible: failed: NCCL timeout"
    loop.step(3)
    with session_scope(session_factory(engine)) as session:
        job = session.get(Job, loop.job_id)
        assert job is not None
        job.status = "failed"
    assert loop.step(4).detail.startswith("infeasible: failed: the job failed")
    # No trial on a dead job: the study ends, and the job is left on its pre-study config.
    ended = loop.step(5)
    assert ended.action == "ended" and ended.detail.startswith("failed: the job is failed")
    assert loop.step(6) == StepResult("skip", detail="study is failed")
    outcome = jobsim.desired(engine, loop.job_id)[-1]
    assert outcome.source == study_outcome_source(loop.study_id)
    assert outcome.config == jobsim.START_CONFIG


def test_an_unacknowledged_trial_times_out(engine: Engine) -> None:
    loop = make_loop(engine, options=StudyOptions(measurement=POLICY, ranks=2, ack_timeout_s=60))
    loop.step(0)
    late = (utcnow() + timedelta(seconds=61) - loop.t0).total_seconds()
    told = loop.step(late)
    assert told.detail.startswith("failed: the job did not acknowledge desired version 1")
    # No new trial (it would time out too) until the job shows signs of life.
    assert loop.step(late + 1).detail == "the job has not reported since its last trial timed out"
    assert loop.trials()[-1].number == 1
    jobsim.report(loop.engine, loop.job_id, 0, at=utcnow() + timedelta(seconds=5))
    assert loop.step(late + 2).action == "asked"


def test_a_desired_config_written_by_someone_else_supersedes_the_trial(loop: Loop) -> None:
    loop.step(0)
    with session_scope(session_factory(loop.engine)) as session:
        job = session.get(Job, loop.job_id)
        assert job is not None
        from tuneloop.job_configs import propose

        propose(session, job, {"batch_size": 8}, source="api")
    told = loop.step(1)
    assert told.detail == "failed: superseded by desired version 2 (api)"
    assert loop.step(2) == StepResult("skip", detail="study is stopped"), "theirs stays"
    assert [r.version for r in jobsim.desired(loop.engine, loop.job_id)] == [1, 2]
    stopped = [e for e in loop.audit() if e.action == "study.state"]
    assert stopped[0].details["reason"] == "superseded by desired version 2 (api)"


def test_max_trials_completes_the_study_with_the_best_config(engine: Engine) -> None:
    loop = make_loop(
        engine,
        objective="throughput",
        options=StudyOptions(measurement=POLICY, ranks=RANKS, max_trials=2),
    )
    values = []
    for number, per_rank in ((1, 90.0), (2, 120.0)):
        base = 100.0 * number
        assert loop.step(base).action == "asked"
        loop.ack(number, at=base)
        loop.step(base + 1)
        loop.steps(base, base + 31, per_rank=per_rank)
        assert loop.step(base + 31).detail == "complete"
        values.append(loop.trials()[-1].value)
    assert values == [pytest.approx(180.0, rel=0.01), pytest.approx(240.0, rel=0.01)]
    done = loop.step(400)
    assert (done.action, done.trial) == ("completed", 2)
    rows = jobsim.desired(engine, loop.job_id)
    best = loop.trials()[1]
    assert rows[-1].version == 3 and rows[-1].config == best.params
    assert loop.step(401) == StepResult("skip", detail="study is complete")
    entry = next(e for e in loop.audit() if e.action == "study.complete")
    assert entry.details["best"]["number"] == 2


def test_slo_throughput_is_infeasible_over_the_slo(engine: Engine) -> None:
    loop = make_loop(
        engine,
        objective="slo_throughput",
        options=StudyOptions(measurement=POLICY, ranks=RANKS, slo_s=0.1),
    )
    for number, fast in ((1, False), (2, True)):
        base = 100.0 * number
        loop.step(base)
        loop.ack(number, at=base)
        loop.step(base + 1)
        loop.steps(base, base + 31, per_rank=50.0)
        # Most requests under 50 ms when fast; a tenth over 200 ms when slow.
        rates = [99.5, 0.5, 0.0] if fast else [80.0, 10.0, 10.0]
        jobsim.write_latency(
            engine,
            loop.project_id,
            "train",
            start=loop.t0 + timedelta(seconds=base),
            end=loop.t0 + timedelta(seconds=base + 31),
            bounds=[0.05, 0.2, math.inf],
            per_second=rates,
        )
        loop.step(base + 31)
    slow, quick = loop.trials()
    assert slow.state == "infeasible" and slow.measurements["reason"].startswith("slo: p99")
    assert quick.state == "complete" and quick.value == pytest.approx(100.0, rel=0.01)
    assert quick.measurements["data"]["inputs"]["p99_latency_s"] < 0.1


def test_agent_driven_studies_are_left_to_the_agent(engine: Engine) -> None:
    loop = make_loop(engine, options=StudyOptions(driven_by="agent", ranks=2))
    assert loop.step(0) == StepResult("skip", detail="driven by the job's agent")
    assert loop.trials() == []


def test_warm_start_from_an_earlier_job_with_the_same_signature(engine: Engine) -> None:
    labels = {"model": "resnet50", "accelerator": "h100"}
    with session_scope(session_factory(engine)) as session:
        first_job = jobsim.make_job(session, name="first", labels=labels)
        other_job = jobsim.make_job(session, name="other", labels={"model": "bert", **{}})
        first = service.create_study(
            session,
            first_job,
            name="a",
            objective="throughput",
            space=SPACE,
            strategy="bayesian",
            seed=1,
            options=StudyOptions(ranks=2),
        )
        for value in (10.0, 30.0, 20.0):
            trial = service.ask(session, first)
            service.tell(session, first, trial.number, state="complete", value=value)
        best_config = {
            k: v for k, v in (service.best(session, first) or trial).params.items() if k in SPACE
        }
        unrelated = service.create_study(
            session,
            other_job,
            name="b",
            objective="throughput",
            space=SPACE,
            strategy="bayesian",
            seed=1,
        )
        assert service.study_options(unrelated).warm_start_from == ()
        second_job = jobsim.make_job(session, name="second", labels=labels)
        second = service.create_study(
            session,
            second_job,
            name="a",
            objective="throughput",
            space=SPACE,
            strategy="bayesian",
            seed=1,
            options=StudyOptions(ranks=2),
        )
        assert service.study_options(second).warm_start_from == (first.id,)
        assert len(service.prior_observations(session, second)) == 3
        proposal = service.ask(session, second)
        # BO first re-measures the best configuration of the earlier job.
        assert {k: v for k, v in proposal.params.items() if k in SPACE} == best_config
        other_ranks = service.create_study(
            session,
            second_job,
            name="c",
            objective="throughput",
            space=SPACE,
            strategy="bayesian",
            options=StudyOptions(ranks=8),
        )
        assert service.study_options(other_ranks).warm_start_from == ()


def test_strategy_options_are_stored_and_used(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session)
        study = service.create_study(
            session,
            job,
            name="s",
            objective="throughput",
            space=SPACE,
            strategy="bayesian",
            options=StudyOptions(strategy_options={"n_initial_points": 2}),
        )
        assert study.options["strategy_options"] == {"n_initial_points": 2}
        strategy = service.study_strategy(study)
        assert getattr(strategy, "n_initial_points") == 2


def test_a_pass_that_dies_mid_way_leaves_nothing_and_the_next_one_repeats_nothing(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tuner.loop as loop_module

    loop.run_baseline()
    from tuner.loop_measure import audit_trial as real_audit

    def crash_after_writing(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("worker killed")  # after ask and the desired config, before commit

    monkeypatch.setattr(loop_module, "audit_trial", crash_after_writing)
    with pytest.raises(RuntimeError, match="worker killed"):
        loop.step(0)
    assert [t.number for t in loop.trials()] == [1]
    assert [r.version for r in jobsim.desired(loop.engine, loop.job_id)] == [1]

    monkeypatch.setattr(loop_module, "audit_trial", real_audit)
    assert loop.step(1).action == "asked"
    assert [t.number for t in loop.trials()] == [1, 2]
    assert [r.version for r in jobsim.desired(loop.engine, loop.job_id)] == [1, 2]


def test_concurrent_passes_start_one_trial(loop: Loop) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(loop.step, [0.0, 0.0, 0.0, 0.0]))
    assert sorted(r.action for r in results) == [
        "asked",
        "awaiting_ack",
        "awaiting_ack",
        "awaiting_ack",
    ]
    assert [t.number for t in loop.trials()] == [1]
    assert [r.version for r in jobsim.desired(loop.engine, loop.job_id)] == [1]
