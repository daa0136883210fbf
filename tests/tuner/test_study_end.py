"""How studies end, on SQLite and PostgreSQL: whatever ends a study (all trials failing, noise,
a cancel, a stop, a job that stops acknowledging), the job is left on a config measured as
good: the best one only when it beat the pre-study config beyond the noise, else the pre-study
config itself. The job side is simulated in the store and the clock passed in."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from actuators.job import set_policy
from actuators.policy_config import ActuationPolicy
from tests.tuner import jobsim
from tests.tuner.test_loop import POLICY, RANKS, SPACE, Loop, make_loop
from tuneloop.job_configs import study_outcome_source
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import Job, Study, Trial
from tuneloop.storage.types import utcnow
from tuner import service
from tuner.loop import StepResult
from tuner.space import SearchSpace
from tuner.strategies.base import BestEstimate
from tuner.study_end import END_STATES, beats_baseline, complete
from tuner.study_options import StudyOptions


def study_row(loop: Loop) -> Study:
    with session_scope(session_factory(loop.engine)) as session:
        study = session.get_one(Study, loop.study_id)
        session.expunge(study)
        return study


def drive(loop: Loop, start: float, end: float, every_s: float = 5.0) -> StepResult:
    """Passes every ``every_s`` from ``start`` until one tells a trial or ends the study."""
    at = start
    while at <= end:
        result = loop.step(at)
        if result.action in ("told", "completed", "ended"):
            return result
        at += every_s
    raise AssertionError(f"nothing was told between {start} and {end}")


def assert_back_on_the_pre_study_config(loop: Loop) -> None:
    rows = jobsim.desired(loop.engine, loop.job_id)
    assert rows[-1].config == jobsim.START_CONFIG
    study = study_row(loop)
    assert study.state in END_STATES and study.ended_at is not None and study.end_reason
    if rows[-1].version > 1:  # the study moved the job: one outcome config moved it back
        assert rows[-1].source == study_outcome_source(loop.study_id)
        assert study.outcome_version == rows[-1].version


def test_a_study_whose_trials_all_fail_ends_failed_where_the_job_was(engine: Engine) -> None:
    loop = make_loop(engine, options=StudyOptions(measurement=POLICY, ranks=RANKS, max_trials=4))
    loop.ack(1, at=0)
    # The job reports no step timings at all: nothing usable is ever measured.
    first = drive(loop, 0, 200)
    assert first.trial == 1 and first.detail.startswith("failed")
    second = drive(loop, 205, 400)
    assert second.trial == 2 and second.detail.startswith("failed"), "the baseline again"
    ended = loop.step(405)
    assert ended.action == "ended"
    assert ended.detail.startswith("failed: the pre-study config could not be measured in 2")
    assert [t.baseline for t in loop.trials()] == [True, True]
    assert [r.version for r in jobsim.desired(engine, loop.job_id)] == [1], "it never moved"
    assert_back_on_the_pre_study_config(loop)
    assert study_row(loop).state == "failed"
    [entry] = [e for e in loop.audit() if e.action == "study.failed"]
    assert entry.details["reason"] == study_row(loop).end_reason


def test_failing_trials_after_an_infeasible_baseline_restore_the_pre_study_config(
    engine: Engine,
) -> None:
    loop = make_loop(engine, options=StudyOptions(measurement=POLICY, ranks=RANKS, max_trials=2))
    loop.step(0)
    loop.ack(1, at=1, status="failed", reason="NCCL timeout")
    assert loop.step(2).detail == "infeasible: failed: NCCL timeout"
    assert loop.step(3).action == "asked"
    loop.ack(2, at=4)
    assert drive(loop, 5, 200).detail.startswith("failed")
    ended = loop.step(205)
    assert ended.action == "ended" and "no trial completed" in ended.detail
    assert "back on its pre-study config (version 1)" in ended.detail
    assert [r.version for r in jobsim.desired(engine, loop.job_id)] == [1, 2, 3]
    assert_back_on_the_pre_study_config(loop)
    assert study_row(loop).state == "failed"


def test_a_noisy_study_leaves_the_job_on_its_pre_study_config(engine: Engine) -> None:
    loop = make_loop(
        engine,
        objective="throughput",
        options=StudyOptions(measurement=POLICY, ranks=RANKS, max_trials=2),
    )
    at = 0.0
    while study_row(loop).state == "running" and at < 2000:
        result = loop.step(at)
        if result.action == "asked":
            version = loop.trials()[-1].desired_version
            assert version is not None
            loop.ack(version, at=at)
            # Every trial sees the same job, ±50% from one sample to the next.
            loop.steps(at, at + 150, per_rank=100.0, wobble=0.5)
        at += 5
    assert_back_on_the_pre_study_config(loop)


def test_a_cancelled_study_restores_the_pre_study_config(engine: Engine) -> None:
    loop = make_loop(engine)
    loop.run_baseline()
    assert loop.step(0).action == "asked"
    with session_scope(session_factory(engine)) as session:
        study = session.get_one(Study, loop.study_id)
        assert service.cancel_study(session, study, actor="alice") is True
        assert service.cancel_study(session, study, actor="alice") is False, "idempotent"
        with pytest.raises(service.StudyEndedError, match="is cancelled"):
            service.set_state(session, study, "running")
    assert [(t.state, t.measurements["reason"]) for t in loop.trials()][-1] == (
        "failed",
        "study cancelled",
    )
    rows = jobsim.desired(engine, loop.job_id)
    assert [r.version for r in rows] == [1, 2, 3]
    assert_back_on_the_pre_study_config(loop)
    study = study_row(loop)
    assert study.state == "cancelled" and study.outcome_version == 3
    assert study.end_reason.startswith("cancelled by alice; the job is back on its pre-study")
    assert loop.step(1) == StepResult("skip", detail="study is cancelled")
    assert [e.action for e in loop.audit()].count("study.cancelled") == 1


def test_stopping_restores_the_pre_study_config_and_resuming_goes_on(engine: Engine) -> None:
    loop = make_loop(engine)
    loop.run_baseline()
    loop.step(0)
    with session_scope(session_factory(engine)) as session:
        study = session.get_one(Study, loop.study_id)
        assert service.set_state(session, study, "stopped", actor="alice")
    rows = jobsim.desired(engine, loop.job_id)
    assert (rows[-1].version, rows[-1].config) == (3, jobsim.START_CONFIG)
    assert rows[-1].source == study_outcome_source(loop.study_id)
    stopped = study_row(loop)
    assert stopped.state == "stopped" and stopped.ended_at is None
    assert "back on its pre-study config" in stopped.end_reason
    with session_scope(session_factory(engine)) as session:
        study = session.get_one(Study, loop.study_id)
        assert service.set_state(session, study, "running", actor="alice")
    resumed = loop.step(1)
    assert (resumed.action, resumed.trial, resumed.detail) == ("asked", 3, "desired version 4")
    assert study_row(loop).end_reason == ""


def test_a_job_that_stops_acknowledging_ends_the_study_failed(engine: Engine) -> None:
    options = StudyOptions(measurement=POLICY, ranks=RANKS, ack_timeout_s=60)
    loop = make_loop(engine, options=options)
    loop.run_baseline()
    assert loop.step(0).action == "asked"  # trial 2, desired version 2, never acknowledged
    late = (utcnow() + timedelta(seconds=61) - loop.t0).total_seconds()
    assert loop.step(late).detail.startswith("failed: the job did not acknowledge")
    assert loop.step(late + 30).detail == "the job has not reported since its last trial timed out"
    ended = loop.step(late + 61)
    assert ended.action == "ended"
    assert ended.detail.startswith("failed: the job stopped acknowledging: nothing reported for")
    assert [r.version for r in jobsim.desired(engine, loop.job_id)] == [1, 2, 3]
    assert_back_on_the_pre_study_config(loop)


def test_a_best_that_does_not_beat_the_pre_study_config_is_not_applied(engine: Engine) -> None:
    options = StudyOptions(measurement=POLICY, ranks=RANKS, max_trials=2)
    loop = make_loop(engine, objective="throughput", options=options)
    loop.run_baseline(per_rank=120.0)
    loop.step(0)
    loop.ack(2, at=0)
    loop.step(1)
    loop.steps(0, 31, per_rank=90.0)
    assert loop.step(31).detail == "complete"
    done = loop.step(32)
    assert done.action == "completed" and done.trial == 1
    assert "the pre-study config was the best" in done.detail
    assert_back_on_the_pre_study_config(loop)
    assert study_row(loop).state == "complete"


def measured(number: int, value: float, stderr: float) -> BestEstimate:
    return BestEstimate({}, value, stderr, (number,))


def test_the_best_must_beat_the_baseline_by_twice_the_noise_of_the_difference() -> None:
    base = measured(1, 100.0, 3.0)
    assert beats_baseline("maximize", measured(2, 111.0, 4.0), base)[0]  # 11 > 2 x 5
    assert not beats_baseline("maximize", measured(2, 109.0, 4.0), base)[0]
    assert beats_baseline("maximize", measured(2, 100.5, 0.0), measured(1, 100.0, 0.0))[0]
    assert beats_baseline("minimize", measured(2, 89.0, 4.0), base)[0]
    assert not beats_baseline("minimize", measured(2, 111.0, 0.0), base)[0]
    figures = beats_baseline("maximize", measured(2, 109.0, 4.0), base)[1]
    assert figures == (
        "trial 2 (109 ± 4) vs the pre-study config's trial 1 (100 ± 3): difference 9, 2 x noise 10"
    )


def test_repeats_of_a_config_are_pooled_before_the_comparison(engine: Engine) -> None:
    """The config kept is best_estimate's: one lucky noisy trial does not beat a config
    measured precisely twice, and the baseline's repeats are pooled too."""
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session)
        study = service.create_study(
            session, job, name="s", objective="throughput", space=SPACE, strategy="grid"
        )
        baseline = Trial(
            study_id=study.id, number=1, params=dict(jobsim.START_CONFIG), baseline=True
        )
        session.add(baseline)
        session.flush()
        service.tell(session, study, 1, state="complete", value=100.0, stderr=1.0)
        lucky = service.ask(session, study)
        service.tell(session, study, lucky.number, state="complete", value=130.0, stderr=40.0)
        outcome = complete(session, study, job, "2 trials done", actor="tuner")
        assert outcome.state == "complete" and outcome.version is None
        assert "the pre-study config was the best measured (trial 1 (100 ± 1))" in outcome.reason


@pytest.mark.parametrize(
    ("space", "config", "message"),
    [
        (SPACE, None, "has no desired config to start the study from"),
        (SPACE, {"batch_size": 128, "sync_period": 1}, "space.batch_size: the job runs"),
        (
            SPACE,
            {"batch_size": 48, "sync_period": 1},
            r"=48 \(desired version 1\), not a power of two; set space.batch_powers_of_two false",
        ),
        (SPACE, {"batch_size": 32, "sync_period": 4}, "space.sync_period: the job runs"),
        (
            SearchSpace.training((8, 64), bucket_mb=(10, 50), lr_scaling=None),
            {"batch_size": 32},
            r"space.bucket_mb: the job's config \(desired version 1\) has no bucket_mb",
        ),
    ],
)
def test_a_study_is_refused_when_the_job_s_current_config_is_not_in_its_space(
    engine: Engine, space: SearchSpace, config: dict[str, int] | None, message: str
) -> None:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session, config=config)
        with pytest.raises(service.StudyError, match=message):
            service.create_study(
                session, job, name="s", objective="throughput", space=space, strategy="grid"
            )
        # A job without a sync_period synchronises every step: that is in the space.
        other = jobsim.make_job(session, name="other", config={"batch_size": 16})
        study = service.create_study(
            session, other, name="s", objective="throughput", space=SPACE, strategy="grid"
        )
        assert study.baseline_version == 1


def test_a_proposal_the_job_s_bounds_refuse_is_infeasible_not_a_stuck_pass(engine: Engine) -> None:
    loop = make_loop(engine, strategy="grid")
    bounds = {"bounds": {"batch_size": {"min": 32}, "sync_period": {"max": 1}}}
    with session_scope(session_factory(engine)) as session:
        set_policy(session, session.get_one(Job, loop.job_id), ActuationPolicy.from_dict(bounds))
    loop.run_baseline()
    refused = 0
    while (result := loop.step(refused)).action == "told":
        assert result.detail.startswith("infeasible: refused: desired config outside the bounds")
        refused += 1
    assert refused >= 1 and result.action == "asked", result
    asked = loop.trials()[-1].params
    assert asked["batch_size"] >= 32 and asked["sync_period"] == 1
