"""The job actuator's reconcile loop against the store (real SQLite and PostgreSQL), with the
objective measured from real step-timing samples."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from api.services import jobs as job_service
from tuneloop import accounts
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import AuditEntry, Job, JobConfigRelease
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow
from tuner.actuators import job as actuator
from tuner.actuators.policy import ActuationPolicy
from tuner.actuators.tasks import reconcile_all

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
        return job_service.append_config(session, job, "desired", config, source="tuner").version


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
        released = job_service.released_config(session, job)
        assert released is not None
        assert (released.version, released.config, released.source) == (
            3,
            {"batch_size": 16},
            "actuator",
        )
        [bad] = job_service.config_marks(session, job)
        assert (bad.version, bad.config, bad.reason) == (2, {"batch_size": 64}, "objective_worse")
        assert bad.evidence["baseline"]["mean"] == pytest.approx(1000, rel=0.05)
        state = job_service.actuator_row(session, job)
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
        assert job_service.config_marks(session, job) == []
        [good] = job_service.config_marks(session, job, "good")
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
    assert seen[:6] == [
        ("wait", "frozen"),  # the adopted starting config was a change too
        ("step", "max_change"),
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
        final = job_service.released_config(session, job)
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


def study_desire(sessions: sessionmaker[Session], job_id: int, config: dict[str, int]) -> int:
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        row = job_service.append_config(session, job, "desired", config, source="tuner:study:1")
        return row.version


def test_a_studys_trials_are_released_without_verification_holding_them(
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
    # one is slower: the study scores it and keeps the best, the actuator rolls nothing back.
    assert reconcile(sessions, job_id, now) == ("release", "goal")
    assert reconcile(sessions, job_id, now) == ("confirm", "unverified")
    throughput(engine, now, 3, 500.0)
    assert study_desire(sessions, job_id, {"batch_size": 128}) == 4
    now += timedelta(seconds=3)
    assert reconcile(sessions, job_id, now) == ("release", "goal")
    assert reconcile(sessions, job_id, now) == ("confirm", "unverified")
    assert reconcile(sessions, job_id, now) == ("none", "in_sync")
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert job_service.config_marks(session, job) == []  # nothing marked bad
