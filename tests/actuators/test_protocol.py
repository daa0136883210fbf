"""The job-config protocol of the domain, on the real store: one reconcile of one job now,
a job's state, and the one bounds check of a desired version."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from actuators import job as actuator
from actuators.policy_config import ActuationPolicy
from actuators.tasks import reconcile_now
from tuneloop import accounts, job_configs
from tuneloop import jobs as job_service
from tuneloop.errors import InvalidInput
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import Job
from tuneloop.storage.types import utcnow

POLICY = {"bounds": {"batch_size": {"min": 8, "max": 64}}, "verify": {"enabled": False}}


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


def propose(sessions: sessionmaker[Session], job_id: int, config: dict[str, int]) -> int:
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job_configs.propose(session, job, config, source="tuner").version


def test_reconcile_now_releases_and_confirms_a_new_desired_version_once(
    sessions: sessionmaker[Session], job_id: int
) -> None:
    assert reconcile_now(sessions, job_id) is None  # settled: nothing to do, nothing written
    version = propose(sessions, job_id, {"batch_size": 32})
    later = utcnow() + timedelta(seconds=60)
    assert reconcile_now(sessions, job_id, now=later) == "release"
    assert reconcile_now(sessions, job_id, now=later) == "confirm"  # verification is off
    assert reconcile_now(sessions, job_id, now=later) is None
    assert reconcile_now(sessions, job_id + 1000) is None  # no such job
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None
        now = job_configs.state(session, job)
        assert now.desired is not None and now.desired.version == version
        assert now.released is not None and now.released.version == version
        assert now.observed is None and not now.in_sync
        job_configs.acknowledge(session, job, version)
        acked = job_configs.state(session, job)
        assert acked.acknowledged_version == version and acked.in_sync


def test_propose_refuses_a_config_outside_the_bounds(
    sessions: sessionmaker[Session], job_id: int
) -> None:
    with pytest.raises(InvalidInput, match=r"batch_size=128 is above its maximum 64"):
        propose(sessions, job_id, {"batch_size": 128})
