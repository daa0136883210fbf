"""Study end states (issue: end states): each study's pre-study desired version, why and when it
ended and the desired version it left the job on; each trial says whether it measured the
pre-study config (the baseline its best is compared with).

Existing studies have no known pre-study version (``NULL``); those already ``complete`` get an
end reason saying so, every other trial is not a baseline.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tuneloop.storage.types import UTCDateTime

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EARLIER_COMPLETE = "complete: ended before end reasons were recorded"


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("baseline_version", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("end_reason", sa.Text(), server_default="", nullable=False))
        batch.add_column(sa.Column("ended_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("outcome_version", sa.Integer(), nullable=True))
    with op.batch_alter_table("trials") as batch:
        batch.add_column(
            sa.Column("baseline", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    op.execute(
        sa.text("UPDATE studies SET end_reason = :why WHERE state = 'complete'").bindparams(
            why=_EARLIER_COMPLETE
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("baseline")
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("outcome_version")
        batch.drop_column("ended_at")
        batch.drop_column("end_reason")
        batch.drop_column("baseline_version")
