"""GPU prices: the price of a GPU-hour per accelerator model and capacity type (on-demand,
spot, reserved), server-wide or per project, so the cost view reports money next to GPU-hours
and energy (``tuneloop.prices``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tuneloop.storage.types import UTCDateTime

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("capacity_type", sa.String(length=20), nullable=False),
        sa.Column("price_per_gpu_hour", sa.Numeric(precision=18, scale=6), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("valid_from", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "capacity_type IN ('on_demand', 'spot', 'reserved')",
            name=op.f("ck_gpu_prices_capacity"),
        ),
        sa.CheckConstraint("price_per_gpu_hour >= 0", name=op.f("ck_gpu_prices_price")),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_gpu_prices_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_prices")),
    )
    op.create_index("ix_gpu_prices_project_id", "gpu_prices", ["project_id"])


def downgrade() -> None:
    op.drop_index("ix_gpu_prices_project_id", table_name="gpu_prices")
    op.drop_table("gpu_prices")
