"""The knobs a job's agent declares (name -> type, range or choices, default; ``tuner.knobs``)
and the host of each rank it speaks for, so that a rank without a GPU (a CPU rank) still has a
host when the diagnosis names it as a straggler.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_ = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_agents") as batch:
        batch.add_column(sa.Column("knobs", JSON_, server_default=sa.text("'{}'"), nullable=False))
        batch.add_column(
            sa.Column("rank_hosts", JSON_, server_default=sa.text("'{}'"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("job_agents") as batch:
        batch.drop_column("rank_hosts")
        batch.drop_column("knobs")
