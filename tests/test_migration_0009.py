"""Migration 0009 moves the job-config keys and the study seed into typed columns, and back.

Old-style rows are written at revision 0008 as the earlier code wrote them, on real SQLite and
real PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from tuneloop import job_configs
from tuneloop.storage import make_engine, migrate, session_factory, session_scope
from tuneloop.storage.models import Job
from tuneloop.storage.types import UTCDateTime

BOTH = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]
JSON_ = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
NOW = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)

projects = sa.table(
    "projects", sa.column("id"), sa.column("name"), sa.column("created_at", UTCDateTime())
)
jobs = sa.table(
    "jobs",
    sa.column("id"),
    sa.column("project_id"),
    sa.column("name"),
    sa.column("kind"),
    sa.column("labels", JSON_),
    sa.column("status"),
    sa.column("created_at", UTCDateTime()),
    sa.column("updated_at", UTCDateTime()),
)
studies = sa.table(
    "studies",
    sa.column("id"),
    sa.column("job_id"),
    sa.column("name"),
    sa.column("objective"),
    sa.column("direction"),
    sa.column("strategy"),
    sa.column("space", JSON_),
    sa.column("state"),
    sa.column("created_at", UTCDateTime()),
)
configs = sa.table(
    "job_configs",
    sa.column("job_id"),
    sa.column("kind"),
    sa.column("version"),
    sa.column("config", JSON_),
    sa.column("source"),
    sa.column("created_at", UTCDateTime()),
)

SPACE = {"params": [{"name": "batch_size", "kind": "int", "low": 8, "high": 64}]}
# (kind, version, config, source) as the code before 0009 wrote them.
OLD_CONFIGS: list[tuple[str, int, dict[str, Any], str]] = [
    ("desired", 1, {"batch_size": 32}, "agent"),
    ("desired", 2, {"batch_size": 64}, "tuner:study:1"),
    ("desired", 3, {"batch_size": 32}, "tuner:study:1:outcome"),
    ("desired", 4, {"batch_size": 16}, "actuator"),
    ("desired", 5, {"batch_size": 8}, "tuner:study:99"),  # its study was deleted
    ("desired", 6, {"batch_size": 8}, "ci"),
    ("observed", 1, {"batch_size": 32, "desired_version": 1}, "agent"),
    (
        "observed",
        2,
        {"batch_size": 64, "desired_version": 2, "status": "oom", "reason": "CUDA OOM"},
        "api",
    ),
    ("observed", 3, {"tp": 4, "desired_version": "x", "status": "weird"}, "api"),
]


def write_old_rows(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.insert(projects).values(id=1, name="p", created_at=NOW))
        connection.execute(
            sa.insert(jobs).values(
                id=1,
                project_id=1,
                name="train",
                kind="training",
                labels={},
                status="running",
                created_at=NOW,
                updated_at=NOW,
            )
        )
        for study_id, seed in ((1, 7), (2, None)):
            connection.execute(
                sa.insert(studies).values(
                    id=study_id,
                    job_id=1,
                    name=f"s{study_id}",
                    objective="throughput",
                    direction="maximize",
                    strategy="random",
                    space={**SPACE, "strategy_seed": seed},
                    state="running",
                    created_at=NOW,
                )
            )
        for kind, version, config, source in OLD_CONFIGS:
            connection.execute(
                sa.insert(configs).values(
                    job_id=1,
                    kind=kind,
                    version=version,
                    config=config,
                    source=source,
                    created_at=NOW,
                )
            )
    engine.dispose()


def read(url: str, query: str) -> list[dict[str, Any]]:
    """Rows of ``query``; its ``config`` and ``space`` columns decoded from JSON."""
    typed = sa.text(query).columns(config=JSON_, space=JSON_)
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return [dict(row) for row in connection.execute(typed).mappings()]
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_upgrade_moves_keys_into_typed_columns_and_downgrade_moves_them_back(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    migrate.upgrade(url, "0008")
    write_old_rows(url)

    migrate.upgrade(url, "0009")

    rows = read(
        url,
        "SELECT kind, version, config, source, origin, origin_study_id, acknowledged_version, "
        "status, reason FROM job_configs ORDER BY id",
    )
    moved = [
        (
            r["kind"],
            r["version"],
            r["config"],
            r["source"],
            r["origin"],
            r["origin_study_id"],
            r["acknowledged_version"],
            r["status"],
            r["reason"],
        )
        for r in rows
    ]
    assert moved == [
        ("desired", 1, {"batch_size": 32}, "agent", "agent", None, None, "running", ""),
        ("desired", 2, {"batch_size": 64}, "tuner:study:1", "tuner-trial", 1, None, "running", ""),
        (
            "desired",
            3,
            {"batch_size": 32},
            "tuner:study:1:outcome",
            "study-outcome",
            1,
            None,
            "running",
            "",
        ),
        ("desired", 4, {"batch_size": 16}, "actuator", "actuator", None, None, "running", ""),
        (
            "desired",
            5,
            {"batch_size": 8},
            "tuner:study:99",
            "tuner-trial",
            None,
            None,
            "running",
            "",
        ),
        ("desired", 6, {"batch_size": 8}, "ci", "api", None, None, "running", ""),
        ("observed", 1, {"batch_size": 32}, "agent", "agent", None, 1, "running", ""),
        ("observed", 2, {"batch_size": 64}, "api", "api", None, 2, "oom", "CUDA OOM"),
        # Values the earlier code never read stay where they were.
        (
            "observed",
            3,
            {"tp": 4, "desired_version": "x", "status": "weird"},
            "api",
            "api",
            None,
            None,
            "running",
            "",
        ),
    ]
    seeds = [
        (r["id"], r["seed"], r["space"])
        for r in read(url, "SELECT id, seed, space FROM studies ORDER BY id")
    ]
    assert seeds == [(1, 7, SPACE), (2, None, SPACE)]
    # The domain reads the moved values: the latest observed version acknowledged nothing, the
    # one before it was an OOM of desired version 2.
    engine = make_engine(url)
    with session_scope(session_factory(engine)) as session:
        job = session.get(Job, 1)
        assert job is not None
        ack = job_configs.first_acknowledgement(session, job, 2)
        assert ack is not None and (ack.version, ack.status) == (2, "oom")
    engine.dispose()

    migrate.downgrade(url, "0008")

    back = [
        (r["kind"], r["version"], r["config"], r["source"])
        for r in read(url, "SELECT kind, version, config, source FROM job_configs ORDER BY id")
    ]
    assert back == OLD_CONFIGS
    spaces = [r["space"] for r in read(url, "SELECT space FROM studies ORDER BY id")]
    assert spaces == [{**SPACE, "strategy_seed": 7}, {**SPACE, "strategy_seed": None}]


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_downgrade_names_the_study_of_versions_written_after_the_upgrade(
    empty_database_url: str,
) -> None:
    """A version written by the new code (origin only) gets the source the earlier code reads
    its role from."""
    url = empty_database_url
    migrate.upgrade(url, "0008")
    write_old_rows(url)
    migrate.upgrade(url)
    engine = make_engine(url)
    with session_scope(session_factory(engine)) as session:
        job = session.get(Job, 1)
        assert job is not None
        job_configs.propose(session, job, {"batch_size": 16}, origin="tuner-trial", study_id=2)
        job_configs.propose(session, job, {"batch_size": 8}, origin="actuator")
    engine.dispose()

    migrate.downgrade(url, "0008")

    sources = read(url, "SELECT version, source FROM job_configs WHERE version > 6")
    assert sorted((r["version"], r["source"]) for r in sources) == [
        (7, "tuner:study:2"),
        (8, "actuator"),
    ]
