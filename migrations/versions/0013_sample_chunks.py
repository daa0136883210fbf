"""Compacted sample chunks: ``sample_chunks`` holds a series' samples of one closed chunk span
(an hour by default) as two pcodec blobs, about 4 bytes a sample instead of 40 to 90 as rows
(docs/storage.md, "Compacted chunks").

The migration only creates the table (partitioned by ``start_ts`` on PostgreSQL, as ``samples``
by ``ts``; its partitions are created by compaction with the bounds of the samples' own). It
converts nothing itself, so ``tuneloop up`` starts at once on a store of any size: the periodic
compaction task converts the existing samples in bounded batches, and ``tuneloop store
compact`` does the same at once, with progress output.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tuneloop.storage.types import UTCDateTime

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sample_chunks",
        sa.Column("series_id", sa.BigInteger(), nullable=False),
        sa.Column("start_ts", UTCDateTime(), nullable=False),
        sa.Column("end_ts", UTCDateTime(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.Column("ts_blob", sa.LargeBinary(), nullable=False),
        sa.Column("values_blob", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("series_id", "start_ts", name=op.f("pk_sample_chunks")),
        postgresql_partition_by="RANGE (start_ts)",
    )


def downgrade() -> None:
    # Chunks hold samples no longer in ``samples``: refuse rather than lose them.
    bind = op.get_bind()
    left = bind.execute(sa.text("SELECT count(*) FROM sample_chunks")).scalar_one()
    if left:
        raise RuntimeError(
            f"sample_chunks still holds {left} chunks; there is no way back to rows only "
            "without losing them"
        )
    op.drop_table("sample_chunks")
