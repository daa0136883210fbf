"""The job actuator's reconcile loop against the store (real SQLite and PostgreSQL), with the
objective measured from real step-timing samples."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from actuators import job as actuator
from actuators.policy_config import ActuationPolicy
from actuators.tasks import reconcile_all
from tuneloop import accounts, job_configs
from tuneloop import jobs as job_service
from tuneloop.job_configs import study_outcome_source, study_trial_source
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import AuditEntry, Job, JobConfigRelease
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow

METRIC = "tuneloop_samples_per_second"
POLICY = {"verify": {"settle_s": 1, "window_s": 10, "min_samples": 4}}


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def job_id(sessions: sessionmaker[Session]) -> int:
    with session_scope(sessions) as session:
        project = accounts.create_project(session, "alpha")
        job = job_service.create_job(session, project, "train", status="running")
        actuator.set_policy(session, job, ActuationPolicy.from_dict(POLICY))
        actuator.adopt_initial(session, job, {"batch_size": 16})
        return job.id


def throughput(engine: Engine, start: datetime, seconds: int, mean: float, rank: str = "0") -> None:
    """Ten step-throughput samples a second, as the OTLP receiver stores them."""
    rng = random.Random(seconds)
    stamps = [start + timedelta(seconds=i / 10) for i in range(seconds * 10)]
    values = [mean * (1 + rng.gauss(0, 0.02)) for _ in stamps]
    with session_scope(session_factory(engine)) as session:
        project_id = session.scalar(select(Job.project_id))
    assert project_id is not None
    labels = {"job": "train", "rank": rank}
    SampleWriter(engine).write(project_id, [SeriesBatch(METRIC, labels, stamps, values)])


def reconcile(sessions: sessionmaker[Session], job_id: int, now: datetime) -> tuple[str, str]:
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        decision = actuator.reconcile_job(session, job, now=now)
        return decision.action, decision.reason


def desire(sessions: sessionmaker[Session], job_id: int, config: dict[str, int]) -> int:
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job_configs.propose(session, job, config, source="tuner").version


def counts(sessions: sessionmaker[Session]) -> tuple[int, int]:
    with session_scope(sessions) as session:
        releases = session.scalar(select(func.count()).select_from(JobConfigRelease))
        audits = session.scalar(
            select(func.count()).select_from(AuditEntry).where(AuditEntry.actor == "actuator")
        )
    return int(releases or 0), int(audits or 0)


def test_a_worse_change_is_rolled_back_and_marked_bad(
    engine: Engine, sessions: sessionmaker[Session], job_id: int
) -> None:
    start = utcnow()  # just after the starting config was adopted
    throughput(engine, start + timedelta(seconds=1), 10, 1000.0)
    now = start + timedelta(seconds=11)
    assert desire(sessions, job_id, {"batch_size": 64}) == 2
    assert reconcile(sessions, job_id, now) == ("release", "goal")
    assert reconcile(sessions, job_id, now + timedelta(seconds=2)) == ("wait", "verifying")
    throughput(engine, now + timedelta(seconds=1), 10, 600.0)
    assert reconcile(sessions, job_id, now + timedelta(seconds=12)) == (
        "rollback",
        "objective_worse",
    )
    done = counts(sessions)
    # Repeated passes (a restarted process) do nothing more.
    for _ in range(2):
        assert reconcile(sessions, job_id, now + timedelta(seconds=13)) == ("none", "in_sync")
    assert counts(sessions) == done

    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        released = job_configs.released_config(session, job)
        assert released is not None
        assert (released.version, released.config, released.source) == (
            3,
            {"batch_size": 16},
            "actuator",
        )
        [bad] = job_configs.config_marks(session, job)
        assert (bad.version, bad.config, bad.reason) == (2, {"batch_size": 64}, "objective_worse")
        assert bad.evidence["baseline"]["mean"] == pytest.approx(1000, rel=0.05)
        state = job_configs.actuator_row(session, job)
        assert state is not None
        assert (state.goal_version, state.released_version, state.last_good_version) == (3, 3, 3)
        actions = list(
            session.scalars(
                select(AuditEntry.action)
                .where(AuditEntry.actor == "actuator")
                .order_by(AuditEntry.id)
            )
        )
        assert actions == ["actuator.release", "actuator.rollback"]


def test_a_job_with_nothing_in_its_verification_window_is_released_on_both_backends(
    engine: Engine, sessions: sessionmaker[Session], job_id: int
) -> None:
    # It reported in the last minutes but not in the last window: the baseline has no mean,
    # which once stalled every reconcile pass on PostgreSQL (its json refuses NaN).
    start = utcnow()
    throughput(engine, start + timedelta(seconds=1), 10, 1000.0)
    now = start + timedelta(seconds=60)
    desire(sessions, job_id, {"batch_size": 64})
    assert reconcile(sessions, job_id, now) == ("release", "goal")
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        released = job_configs.released_config(session, job)
        assert released is not None and released.config == {"batch_size": 64}
        state = job_configs.actuator_row(session, job)
        assert state is not None and state.baseline == {"mean": None, "stderr": None, "n": 0}


def test_a_better_change_is_kept_and_marked_good(
    engine: Engine, sessions: sessionmaker[Session], job_id: int
) -> None:
    start = utcnow()  # just after the starting config was adopted
    throughput(engine, start + timedelta(seconds=1), 10, 1000.0)
    now = start + timedelta(seconds=11)
    desire(sessions, job_id, {"batch_size": 64})
    assert reconcile(sessions, job_id, now)[0] == "release"
    throughput(engine, now + timedelta(seconds=1), 10, 1400.0)
    assert reconcile(sessions, job_id, now + timedelta(seconds=12)) == ("confirm", "verified")
    assert reconcile(sessions, job_id, now + timedelta(seconds=13)) == ("none", "in_sync")
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert job_configs.config_marks(session, job) == []
        [good] = job_configs.config_marks(session, job, "good")
        assert good.version == 2


def test_steps_walk_towards_the_goal_one_freeze_window_at_a_time(
    sessions: sessionmaker[Session], job_id: int
) -> None:
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        policy = {"max_change": {"batch_size": 2}, "freeze_s": 30, "verify": {"enabled": False}}
        actuator.set_policy(session, job, ActuationPolicy.from_dict(policy))
    now = utcnow()
    desire(sessions, job_id, {"batch_size": 64})
    seen = []
    for tick in range(8):
        seen.append(reconcile(sessions, job_id, now + timedelta(seconds=31 * tick)))
    assert seen[:5] == [
        ("step", "max_change"),  # registering the starting config was no change: no freeze
        ("confirm", "unverified"),
        ("release", "goal"),
        ("confirm", "unverified"),
        ("none", "in_sync"),
    ]
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        released = [
            (r.version, r.reason)
            for r in session.scalars(select(JobConfigRelease).order_by(JobConfigRelease.version))
        ]
        # The goal (2) is reached under a new number: released versions only grow.
        assert released == [(1, "goal"), (3, "step"), (4, "goal")]
        final = job_configs.released_config(session, job)
        assert final is not None
        assert final.config == {"batch_size": 64}


def test_dry_run_records_once_and_releases_nothing(
    sessions: sessionmaker[Session], job_id: int
) -> None:
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        actuator.set_policy(session, job, ActuationPolicy.from_dict({"dry_run": True}))
    desire(sessions, job_id, {"batch_size": 64})
    now = utcnow() + timedelta(seconds=60)
    before = counts(sessions)
    for _ in range(3):
        assert reconcile(sessions, job_id, now) == ("dry_run", "dry_run")
    releases, audits = counts(sessions)
    assert (releases, audits) == (before[0], before[1] + 1)


def test_periodic_task_reconciles_every_active_job(
    sessions: sessionmaker[Session], job_id: int
) -> None:
    desire(sessions, job_id, {"batch_size": 32})
    later = utcnow() + timedelta(seconds=60)
    assert reconcile_all(sessions, now=later) == {"release": 1}
    assert reconcile_all(sessions, now=later + timedelta(seconds=60)) == {"confirm": 1}
    assert reconcile_all(sessions, now=later + timedelta(seconds=120)) == {}


def study_desire(
    sessions: sessionmaker[Session], job_id: int, config: dict[str, int], *, outcome: bool = False
) -> int:
    """A desired version written as study 1's trial, or with ``outcome`` as its outcome (no
    study row: the version's origin is what the actuator reads)."""
    origin: job_configs.Origin = "study-outcome" if outcome else "tuner-trial"
    source = study_outcome_source(1) if outcome else study_trial_source(1)
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job_configs.propose(session, job, config, origin=origin, source=source).version


def progress(sessions: sessionmaker[Session], job_id: int) -> tuple[int | None, ...]:
    """(goal, released, last good) versions of the job's actuator."""
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        state = job_configs.actuator_row(session, job)
        assert state is not None
        return state.goal_version, state.released_version, state.last_good_version


def restart(sessions: sessionmaker[Session], job_id: int) -> tuple[int, dict[str, int]]:
    """A restarted job's agent registering from scratch with another starting config: the
    version and config it is told to run."""
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        found = actuator.adopt_initial(session, job, {"batch_size": 8})
        return found.version, dict(found.config)


def test_a_studys_trials_are_released_unverified_and_never_become_last_good(
    engine: Engine, sessions: sessionmaker[Session], job_id: int
) -> None:
    start = utcnow()
    throughput(engine, start + timedelta(seconds=1), 10, 1000.0)
    now = start + timedelta(seconds=11)
    # A person's change is verified as always, and holds a study's trial until it is.
    assert desire(sessions, job_id, {"batch_size": 32}) == 2
    assert reconcile(sessions, job_id, now) == ("release", "goal")
    assert study_desire(sessions, job_id, {"batch_size": 64}) == 3
    assert reconcile(sessions, job_id, now + timedelta(seconds=2)) == ("wait", "verifying")
    throughput(engine, now + timedelta(seconds=1), 10, 1100.0)
    now += timedelta(seconds=12)
    assert reconcile(sessions, job_id, now) == ("confirm", "verified")
    # The study's trials follow one another as fast as the study measures them, even when
    # one is slower: the study scores it, the actuator neither verifies nor rolls back, and
    # the last good version stays the one before the study.
    assert reconcile(sessions, job_id, now) == ("release", "study_trial")
    assert reconcile(sessions, job_id, now) == ("none", "in_sync")
    throughput(engine, now, 3, 500.0)
    assert study_desire(sessions, job_id, {"batch_size": 128}) == 4
    now += timedelta(seconds=3)
    assert reconcile(sessions, job_id, now) == ("release", "study_trial")
    assert reconcile(sessions, job_id, now + timedelta(seconds=60)) == ("none", "in_sync")
    assert progress(sessions, job_id) == (4, 4, 2)
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert job_configs.config_marks(session, job, None) == [
            m for m in job_configs.config_marks(session, job, "good") if m.version == 2
        ]
        assert not actuator.needs_reconcile(session, job)  # a trial waits for its study
    # A job restarted in the middle of the study resumes the trial being measured.
    assert restart(sessions, job_id) == (4, {"batch_size": 128})

    # The study ends and restores the pre-study config: released at once, good as released.
    assert study_desire(sessions, job_id, {"batch_size": 32}, outcome=True) == 5
    assert reconcile(sessions, job_id, now) == ("release", "study_outcome")
    assert reconcile(sessions, job_id, now) == ("none", "in_sync")
    assert progress(sessions, job_id) == (5, 5, 5)
    assert restart(sessions, job_id) == (5, {"batch_size": 32})
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert [m.version for m in job_configs.config_marks(session, job, "good")] == [2, 5]


def test_an_outcome_is_what_a_later_rollback_returns_to(
    engine: Engine, sessions: sessionmaker[Session], job_id: int
) -> None:
    now = utcnow()
    for config in ({"batch_size": 64}, {"batch_size": 256}):
        study_desire(sessions, job_id, config)
        assert reconcile(sessions, job_id, now) == ("release", "study_trial")
    # The best trial beat the pre-study config: the study applies it as its outcome.
    assert study_desire(sessions, job_id, {"batch_size": 64}, outcome=True) == 4
    assert reconcile(sessions, job_id, now) == ("release", "study_outcome")
    assert progress(sessions, job_id) == (4, 4, 4)
    # A person's later change that makes the job slower goes back to the outcome, not to the
    # last trial that ran and not to the config before the study.
    throughput(engine, now + timedelta(seconds=1), 10, 1000.0)
    now += timedelta(seconds=11)
    assert desire(sessions, job_id, {"batch_size": 512}) == 5
    assert reconcile(sessions, job_id, now) == ("release", "goal")
    throughput(engine, now + timedelta(seconds=1), 10, 500.0)
    assert reconcile(sessions, job_id, now + timedelta(seconds=12)) == (
        "rollback",
        "objective_worse",
    )
    assert restart(sessions, job_id) == (6, {"batch_size": 64})


def test_a_trial_once_recorded_as_last_good_gives_way_to_the_version_before_it(
    engine: Engine, sessions: sessionmaker[Session], job_id: int
) -> None:
    now = utcnow()
    study_desire(sessions, job_id, {"batch_size": 256})
    assert reconcile(sessions, job_id, now) == ("release", "study_trial")
    with session_scope(sessions) as session:  # as the actuator recorded trials before
        job = session.get(Job, job_id)
        assert job is not None
        state = job_configs.actuator_row(session, job)
        assert state is not None
        state.last_good_version = 2
    throughput(engine, now + timedelta(seconds=1), 10, 1000.0)
    now += timedelta(seconds=11)
    assert desire(sessions, job_id, {"batch_size": 512}) == 3
    assert reconcile(sessions, job_id, now) == ("release", "goal")
    throughput(engine, now + timedelta(seconds=1), 10, 500.0)
    assert reconcile(sessions, job_id, now + timedelta(seconds=12))[0] == "rollback"
    assert restart(sessions, job_id) == (4, {"batch_size": 16})


def test_the_freeze_spaces_changes_but_not_a_studys_trials_unless_asked(
    sessions: sessionmaker[Session], job_id: int
) -> None:
    policy = {"freeze_s": 60, "verify": {"enabled": False}}
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        actuator.set_policy(session, job, ActuationPolicy.from_dict(policy))
    now = utcnow()
    desire(sessions, job_id, {"batch_size": 32})
    assert reconcile(sessions, job_id, now) == ("release", "goal")  # registering froze nothing
    assert reconcile(sessions, job_id, now) == ("confirm", "unverified")
    desire(sessions, job_id, {"batch_size": 48})
    assert reconcile(sessions, job_id, now + timedelta(seconds=30)) == ("wait", "frozen")
    study_desire(sessions, job_id, {"batch_size": 64})
    assert reconcile(sessions, job_id, now + timedelta(seconds=31)) == ("release", "study_trial")
    study_desire(sessions, job_id, {"batch_size": 128})
    assert reconcile(sessions, job_id, now + timedelta(seconds=32)) == ("release", "study_trial")
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        asked = {**policy, "freeze_study_trials": True}
        actuator.set_policy(session, job, ActuationPolicy.from_dict(asked))
    study_desire(sessions, job_id, {"batch_size": 256})
    assert reconcile(sessions, job_id, now + timedelta(seconds=33)) == ("wait", "frozen")
    # The outcome is never held: the job must not stay on a trial's config.
    study_desire(sessions, job_id, {"batch_size": 32}, outcome=True)
    assert reconcile(sessions, job_id, now + timedelta(seconds=34)) == ("release", "study_outcome")


def test_a_trial_written_while_a_change_is_verified_outlives_its_rollback(
    engine: Engine, sessions: sessionmaker[Session], job_id: int
) -> None:
    start = utcnow()
    throughput(engine, start + timedelta(seconds=1), 10, 1000.0)
    now = start + timedelta(seconds=11)
    assert desire(sessions, job_id, {"batch_size": 512}) == 2
    assert reconcile(sessions, job_id, now) == ("release", "goal")
    assert study_desire(sessions, job_id, {"batch_size": 64}) == 3
    throughput(engine, now + timedelta(seconds=1), 10, 500.0)
    now += timedelta(seconds=12)
    assert reconcile(sessions, job_id, now) == ("rollback", "objective_worse")
    # The trial is released next (under a new number, as released versions only grow), and
    # stays a trial: the study's agent acknowledges it, the last good version is unchanged.
    assert reconcile(sessions, job_id, now) == ("release", "study_trial")
    assert reconcile(sessions, job_id, now) == ("none", "in_sync")
    assert progress(sessions, job_id) == (5, 5, 4)
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        released = job_configs.released_config(session, job)
        assert released is not None
        assert (released.config, released.source) == ({"batch_size": 64}, study_trial_source(1))
