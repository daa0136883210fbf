"""Alerting state beyond the initial tables (issue: alerts): receivers, silences, inhibit rules,
and what rules, instances and notifications need to survive a restart.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from tuneloop.storage.types import UTCDateTime

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, so this revision never changes under it.
JSON_ = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "alert_receivers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("config", JSON_, nullable=False),
        sa.Column("matchers", JSON_, nullable=False),
        sa.Column("group_by", JSON_, nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("last_success_at", UTCDateTime(), nullable=True),
        sa.Column("last_failure_at", UTCDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_alert_receivers_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_receivers")),
        sa.UniqueConstraint("project_id", "name", name=op.f("uq_alert_receivers_project_id")),
    )
    op.create_table(
        "alert_silences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("matchers", JSON_, nullable=False),
        sa.Column("starts_at", UTCDateTime(), nullable=False),
        sa.Column("ends_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_alert_silences_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_silences")),
    )
    op.create_index(
        "ix_alert_silences_project_ends", "alert_silences", ["project_id", "ends_at"], unique=False
    )
    op.create_table(
        "alert_inhibitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("source_matchers", JSON_, nullable=False),
        sa.Column("target_matchers", JSON_, nullable=False),
        sa.Column("equal", JSON_, nullable=False),
        sa.Column("origin", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_alert_inhibitions_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_inhibitions")),
    )
    op.create_index(
        op.f("ix_alert_inhibitions_project_id"), "alert_inhibitions", ["project_id"], unique=False
    )
    with op.batch_alter_table("alert_rules") as batch:
        batch.add_column(
            sa.Column("source", sa.String(length=200), nullable=False, server_default="api")
        )
    with op.batch_alter_table("alert_instances") as batch:
        batch.add_column(sa.Column("annotations", JSON_, nullable=False, server_default="{}"))
        batch.add_column(sa.Column("notified", sa.String(length=10), nullable=True))
        batch.add_column(sa.Column("muted_by", sa.String(length=100), nullable=True))
    with op.batch_alter_table("notifications") as batch:
        batch.add_column(sa.Column("receiver_id", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("group_key", sa.String(length=500), nullable=False, server_default="")
        )
        batch.add_column(sa.Column("alert", JSON_, nullable=False, server_default="{}"))
        batch.add_column(sa.Column("next_attempt_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("response_code", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            batch.f("fk_notifications_receiver_id_alert_receivers"),
            "alert_receivers",
            ["receiver_id"],
            ["id"],
            ondelete="CASCADE",
        )
        batch.create_index(batch.f("ix_notifications_receiver_id"), ["receiver_id"], unique=False)
    # The defaults only filled existing rows; the models give every new row its value.
    with op.batch_alter_table("alert_rules") as batch:
        batch.alter_column("source", server_default=None)
    with op.batch_alter_table("alert_instances") as batch:
        batch.alter_column("annotations", server_default=None)
    with op.batch_alter_table("notifications") as batch:
        batch.alter_column("group_key", server_default=None)
        batch.alter_column("alert", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("notifications") as batch:
        batch.drop_index(batch.f("ix_notifications_receiver_id"))
        batch.drop_constraint(
            batch.f("fk_notifications_receiver_id_alert_receivers"), type_="foreignkey"
        )
        batch.drop_column("response_code")
        batch.drop_column("next_attempt_at")
        batch.drop_column("alert")
        batch.drop_column("group_key")
        batch.drop_column("receiver_id")
    with op.batch_alter_table("alert_instances") as batch:
        batch.drop_column("muted_by")
        batch.drop_column("notified")
        batch.drop_column("annotations")
    with op.batch_alter_table("alert_rules") as batch:
        batch.drop_column("source")
    op.drop_index(op.f("ix_alert_inhibitions_project_id"), table_name="alert_inhibitions")
    op.drop_table("alert_inhibitions")
    op.drop_index("ix_alert_silences_project_ends", table_name="alert_silences")
    op.drop_table("alert_silences")
    op.drop_table("alert_receivers")
