"""Migration 0014 adds the knobs an agent declares and the host of each rank it speaks for to
``job_agents``: a registration written at revision 0013 reads back with neither (empty), one
written after has both, and the downgrade removes them; on real SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import bindparam, inspect, text
from sqlalchemy.orm import Session

from tests.storage.test_writer import make_project
from tuneloop import job_agents
from tuneloop.storage import make_engine, migrate
from tuneloop.storage.models import Job, JobAgent
from tuneloop.storage.types import UTCDateTime, utcnow

BOTH = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]
KNOB = {"type": "int", "low": 0, "high": 8, "log": False, "powers_of_two": False, "default": 2}


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_agent_knobs_and_rank_hosts_up_and_down(empty_database_url: str) -> None:
    url = empty_database_url
    migrate.upgrade(url, "0013")
    engine = make_engine(url)
    try:
        project = make_project(engine)
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO jobs (project_id, name, kind, labels, status, created_at, "
                     "updated_at) VALUES (:p, 'old', 'training', '{}', 'running', :t, :t)"
                     ).bindparams(bindparam("t", type_=UTCDateTime())),
                {"p": project, "t": utcnow()},
            )  # fmt: skip
            job_id = connection.execute(text("SELECT id FROM jobs")).scalar_one()
            connection.execute(
                text("INSERT INTO job_agents (job_id, host, world_size, details, registered_at, "
                     "last_seen_at) VALUES (:j, 'node-1', 2, '{}', :t, :t)"
                     ).bindparams(bindparam("t", type_=UTCDateTime())),
                {"j": job_id, "t": utcnow()},
            )  # fmt: skip
        engine.dispose()
        migrate.upgrade(url, "0014")
        engine = make_engine(url)
        with Session(engine) as session:
            old = session.query(JobAgent).one()
            assert (old.knobs, old.rank_hosts) == ({}, {})
            job = session.get(Job, job_id)
            assert job is not None
            new = job_agents.register_agent(
                session,
                job,
                host="node-1",
                world_size=2,
                ranks=[job_agents.RankGpus(0), job_agents.RankGpus(1, (), "node-2")],
                knobs={"loader_workers": KNOB},
            )
            session.commit()
            assert new.rank_hosts == {"0": "node-1", "1": "node-2"}
            assert job_agents.latest_agent(session, job) is new
        engine.dispose()
        migrate.downgrade(url, "0013")
        engine = make_engine(url)
        with engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("job_agents")}
        assert not {"knobs", "rank_hosts"} & columns
    finally:
        engine.dispose()
