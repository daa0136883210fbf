"""Samples are unique on ``(series_id, ts)`` (issue 15, item 9): a crash during a spool replay
had stored the same samples twice, doubling sums and counts for those times.

The upgrade removes the duplicates already stored, keeping one row per ``(series_id, ts)`` (the
first stored; a replayed row repeats its value), then makes ``ix_samples_series_ts`` unique.
On PostgreSQL the index is created on the partitioned parent, so every partition gets its own
unique index, and every partition created later too; it may be unique because it holds ``ts``,
the partition key. The downgrade makes the index plain again (the removed rows stay removed).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 12:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_samples_series_ts"

# A row's physical address (ctid) is unique only within its partition; duplicates share ts and
# so a partition, and tableoid keeps rows of two partitions apart all the same.
_POSTGRES_DEDUPE = sa.text(
    "DELETE FROM samples AS later USING samples AS earlier"
    " WHERE later.series_id = earlier.series_id AND later.ts = earlier.ts"
    " AND later.tableoid = earlier.tableoid AND later.ctid > earlier.ctid"
)
_SQLITE_DEDUPE = sa.text(
    "DELETE FROM samples WHERE rowid NOT IN (SELECT min(rowid) FROM samples GROUP BY series_id, ts)"
)


def upgrade() -> None:
    bind = op.get_bind()
    bind.execute(_POSTGRES_DEDUPE if bind.dialect.name == "postgresql" else _SQLITE_DEDUPE)
    op.drop_index(INDEX, table_name="samples")
    op.create_index(INDEX, "samples", ["series_id", "ts"], unique=True)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="samples")
    op.create_index(INDEX, "samples", ["series_id", "ts"], unique=False)
