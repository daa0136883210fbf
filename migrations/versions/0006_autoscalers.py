"""Autoscalers (issue: autoscaler actuators): each inference fleet's target, policy, metric
selectors and the reconcile loop's remembered state and last decision.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from tuneloop.storage.types import UTCDateTime

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, so this revision never changes under it.
JSON_ = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "autoscalers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("target_kind", sa.String(length=20), nullable=False),
        sa.Column("target", JSON_, nullable=False),
        sa.Column("policy", JSON_, nullable=False),
        sa.Column("p99_selector", JSON_, nullable=True),
        sa.Column("queue_selector", JSON_, nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("state", JSON_, nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=True),
        sa.Column("last_decision", sa.Integer(), nullable=True),
        sa.Column("last_reason", sa.String(length=30), nullable=True),
        sa.Column("last_decision_at", UTCDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_error_at", UTCDateTime(), nullable=True),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_autoscalers_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autoscalers")),
        sa.UniqueConstraint("project_id", "name", name=op.f("uq_autoscalers_project_id")),
    )


def downgrade() -> None:
    op.drop_table("autoscalers")
