"""Actuator and agent state (issue: actuators): job agents and their GPUs, each job's actuation
policy and progress, config releases and config verdicts.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from tuneloop.storage.types import UTCDateTime

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_ = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _job_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["job_id"], ["jobs.id"], name=op.f(f"fk_{table}_job_id_jobs"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "job_agents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("details", JSON_, nullable=False),
        sa.Column("registered_at", UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", UTCDateTime(), nullable=False),
        _job_fk("job_agents"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_agents")),
    )
    op.create_index(op.f("ix_job_agents_job_id"), "job_agents", ["job_id"])
    op.create_table(
        "job_gpus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=100), nullable=False),
        sa.Column("registered_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["job_agents.id"],
            name=op.f("fk_job_gpus_agent_id_job_agents"),
            ondelete="CASCADE",
        ),
        _job_fk("job_gpus"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_gpus")),
        sa.UniqueConstraint("agent_id", "rank", "gpu_uuid", name=op.f("uq_job_gpus_agent_id")),
    )
    op.create_index("ix_job_gpus_gpu_uuid", "job_gpus", ["gpu_uuid"])
    op.create_index(op.f("ix_job_gpus_job_id"), "job_gpus", ["job_id"])
    op.create_table(
        "job_actuators",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("policy", JSON_, nullable=False),
        sa.Column("goal_version", sa.Integer(), nullable=True),
        sa.Column("released_version", sa.Integer(), nullable=True),
        sa.Column("last_good_version", sa.Integer(), nullable=True),
        sa.Column("approved_version", sa.Integer(), nullable=True),
        sa.Column("changed_at", UTCDateTime(), nullable=True),
        sa.Column("baseline", JSON_, nullable=True),
        sa.Column("conditions", JSON_, nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        _job_fk("job_actuators"),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_actuators")),
    )
    op.create_table(
        "job_config_releases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=50), nullable=False),
        sa.Column("released_at", UTCDateTime(), nullable=False),
        _job_fk("job_config_releases"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_config_releases")),
        sa.UniqueConstraint("job_id", "version", name=op.f("uq_job_config_releases_job_id")),
    )
    op.create_table(
        "job_config_marks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("config", JSON_, nullable=False),
        sa.Column("verdict", sa.String(length=10), nullable=False),
        sa.Column("reason", sa.String(length=200), nullable=False),
        sa.Column("evidence", JSON_, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        _job_fk("job_config_marks"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_config_marks")),
        sa.UniqueConstraint("job_id", "version", name=op.f("uq_job_config_marks_job_id")),
    )


def downgrade() -> None:
    op.drop_table("job_config_marks")
    op.drop_table("job_config_releases")
    op.drop_table("job_actuators")
    op.drop_index(op.f("ix_job_gpus_job_id"), table_name="job_gpus")
    op.drop_index("ix_job_gpus_gpu_uuid", table_name="job_gpus")
    op.drop_table("job_gpus")
    op.drop_index(op.f("ix_job_agents_job_id"), table_name="job_agents")
    op.drop_table("job_agents")
