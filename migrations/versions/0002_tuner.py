"""Tuner loop state: study options; each trial's desired config version, acknowledgement time
and window extensions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from tuneloop.storage.types import UTCDateTime

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_ = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(
            sa.Column("options", JSON_, server_default=sa.text("'{}'"), nullable=False)
        )
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("desired_version", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("applied_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("extensions", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("extensions")
        batch.drop_column("applied_at")
        batch.drop_column("desired_version")
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("options")
