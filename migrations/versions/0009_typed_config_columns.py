"""Typed config columns (issue: one owner per concept): who wrote a config version and what an
observed one says about the desired versions move out of strings and JSON keys into columns of
``job_configs``; a study's strategy seed moves out of ``studies.space`` into ``studies.seed``.

* ``origin`` (``api``, ``agent``, ``tuner-trial``, ``study-outcome``, ``actuator``) and
  ``origin_study_id`` are parsed from ``source`` (``tuner:study:<id>`` a trial,
  ``tuner:study:<id>:outcome`` an outcome, ``actuator``, ``agent``; anything else was written
  through the API). ``source`` stays as it was: free text for the audit trail.
* ``acknowledged_version``, ``status`` and ``reason`` come out of observed configs' JSON
  (keys ``desired_version``, ``status``, ``reason``), which then holds only the job's settings.
  A value of the wrong type (or an unknown status) stays in the JSON: it was never read.
* ``studies.seed`` comes out of ``space['strategy_seed']``.

Observed rows keep their numbers; new ones continue each job's sequence. The downgrade puts
everything back where the earlier code reads it. The keys are spelled out here, so this
revision never changes under the code.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_ = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

STUDY_PREFIX = "tuner:study:"
OUTCOME_SUFFIX = ":outcome"
ACK_KEY, STATUS_KEY, REASON_KEY = "desired_version", "status", "reason"
STATUSES = ("running", "oom", "failed")
SEED_KEY = "strategy_seed"

job_configs = sa.table(
    "job_configs",
    sa.column("id", sa.Integer()),
    sa.column("kind", sa.String()),
    sa.column("config", JSON_),
    sa.column("source", sa.String()),
    sa.column("origin", sa.String()),
    sa.column("origin_study_id", sa.Integer()),
    sa.column("acknowledged_version", sa.Integer()),
    sa.column("status", sa.String()),
    sa.column("reason", sa.Text()),
)
studies = sa.table(
    "studies",
    sa.column("id", sa.Integer()),
    sa.column("space", JSON_),
    sa.column("seed", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("job_configs") as batch:
        batch.add_column(
            sa.Column("origin", sa.String(length=20), server_default="api", nullable=False)
        )
        batch.add_column(sa.Column("origin_study_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("acknowledged_version", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("status", sa.String(length=20), server_default="running", nullable=False)
        )
        batch.add_column(sa.Column("reason", sa.Text(), server_default="", nullable=False))
        batch.create_foreign_key(
            batch.f("fk_job_configs_origin_study_id_studies"),
            "studies",
            ["origin_study_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index(
            batch.f("ix_job_configs_origin_study_id"), ["origin_study_id"], unique=False
        )
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("seed", sa.Integer(), nullable=True))
    bind = op.get_bind()
    known_studies = set(bind.scalars(sa.select(studies.c.id)))
    for row in bind.execute(sa.select(job_configs)).mappings().all():
        bind.execute(
            job_configs.update()
            .where(job_configs.c.id == row["id"])
            .values(**_typed_config(row, known_studies))
        )
    for row in bind.execute(sa.select(studies.c.id, studies.c.space)).mappings().all():
        space = dict(row["space"] or {})
        seed = space.pop(SEED_KEY, None)
        bind.execute(
            studies.update()
            .where(studies.c.id == row["id"])
            .values(space=space, seed=seed if _is_int(seed) else None)
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _origin(source: str | None, known_studies: set[int]) -> tuple[str, int | None]:
    """The origin and study a ``source`` string named, as the earlier code parsed it."""
    if source in ("actuator", "agent"):
        return source, None
    if source is None or not source.startswith(STUDY_PREFIX):
        return "api", None
    rest = source.removeprefix(STUDY_PREFIX)
    origin = "tuner-trial"
    if rest.endswith(OUTCOME_SUFFIX):
        origin, rest = "study-outcome", rest.removesuffix(OUTCOME_SUFFIX)
    study_id = int(rest) if rest.isdigit() else None
    return origin, study_id if study_id in known_studies else None


def _typed_config(row: Any, known_studies: set[int]) -> dict[str, Any]:
    origin, study_id = _origin(row["source"], known_studies)
    values: dict[str, Any] = {"origin": origin, "origin_study_id": study_id}
    if row["kind"] != "observed":
        return values
    config = dict(row["config"] or {})
    if _is_int(config.get(ACK_KEY)):
        values["acknowledged_version"] = config.pop(ACK_KEY)
    if config.get(STATUS_KEY) in STATUSES:
        values["status"] = config.pop(STATUS_KEY)
    if isinstance(config.get(REASON_KEY), str):
        values["reason"] = config.pop(REASON_KEY)
    values["config"] = config
    return values


def downgrade() -> None:
    bind = op.get_bind()
    for row in bind.execute(sa.select(job_configs)).mappings().all():
        values: dict[str, Any] = {"source": _source(row)}
        if row["kind"] == "observed":
            config = dict(row["config"] or {})
            if row["acknowledged_version"] is not None:
                config[ACK_KEY] = row["acknowledged_version"]
            if row["status"] != "running":
                config[STATUS_KEY] = row["status"]
            if row["reason"]:
                config[REASON_KEY] = row["reason"]
            values["config"] = config
        bind.execute(job_configs.update().where(job_configs.c.id == row["id"]).values(**values))
    for row in bind.execute(sa.select(studies)).mappings().all():
        space = {**(row["space"] or {}), SEED_KEY: row["seed"]}
        bind.execute(studies.update().where(studies.c.id == row["id"]).values(space=space))
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("seed")
    with op.batch_alter_table("job_configs") as batch:
        batch.drop_index(batch.f("ix_job_configs_origin_study_id"))
        batch.drop_constraint(batch.f("fk_job_configs_origin_study_id_studies"), type_="foreignkey")
        batch.drop_column("reason")
        batch.drop_column("status")
        batch.drop_column("acknowledged_version")
        batch.drop_column("origin_study_id")
        batch.drop_column("origin")


def _source(row: Any) -> str:
    """The ``source`` the earlier code reads the origin from: a study's versions name their
    study (0 once it was deleted), the actuator's say ``actuator``."""
    if _origin(row["source"], set())[0] == row["origin"]:
        return str(row["source"])
    study = row["origin_study_id"] or 0
    if row["origin"] == "tuner-trial":
        return f"{STUDY_PREFIX}{study}"
    if row["origin"] == "study-outcome":
        return f"{STUDY_PREFIX}{study}{OUTCOME_SUFFIX}"
    if row["origin"] == "actuator":
        return "actuator"
    return str(row["source"])
