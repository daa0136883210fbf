"""Faster long-range dashboard reads (issue: dashboards): index-only reads of the hourly
rollups and a ``tuneloop_series`` that sorts less.

- ``samples_1h``'s primary key carries ``count``, ``sum``, ``min`` and ``max`` as ``INCLUDE``
  columns: the one index the rollup writer already maintains then answers
  ``tuneloop_series`` without visiting the table. The periodic rollup pass writes each hour
  of every series at once, so a series' hourly rows lie on as many table pages as hours read,
  whereas its index entries are adjacent. Reads are index-only where the visibility map marks
  the pages all-visible: ``update_rollups`` vacuums ``samples_1h`` after writing to it.
- ``tuneloop_series`` aggregates each series on its own, inside the lateral, and passes the
  hourly rows through unchanged when the panel's buckets are hours (then each one is a bucket
  of its own); only the rows after the hourly watermark, or buckets coarser than the rollup,
  are grouped. Labels thus stay out of the rows being grouped, and the panel's ``ORDER BY``
  sorts narrow rows (time, name, value) once.

On PostgreSQL the primary key is rebuilt, which locks ``samples_1h`` while the index is built.
SQLite has neither ``INCLUDE`` nor the function: nothing changes there.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Still one STABLE SQL statement, so PostgreSQL inlines it (see 0005): the panel's WHERE on
# labels reaches the series scan, the branches of the resolutions not picked are pruned at
# plan time, and the series scan drives one index range scan per series. Each series is
# grouped in the lateral (a small aggregate of its own rows), not all series at once by
# (bucket, series_id): that grouping sorted every row together with the series' labels and
# spilled to disk at the default work_mem. Hourly rows need no grouping when the buckets are
# hours: the hourly watermark is always a whole hour, so the finer rows read after it never
# fall into the bucket of an hourly row.
_SERIES = """
CREATE OR REPLACE FUNCTION tuneloop_series(
    p_project text, p_metric text, p_from timestamptz, p_to timestamptz, p_interval_ms bigint
) RETURNS TABLE (
    series_id bigint, labels jsonb, bucket timestamptz, avg double precision,
    min double precision, max double precision, sum double precision, count bigint
) LANGUAGE sql STABLE AS $fn$
    SELECT s.id, s.labels, r.bucket, r.avg, r.min, r.max, r.sum, r.count
    FROM series AS s
    JOIN projects AS p ON p.id = s.project_id
    CROSS JOIN LATERAL (
        SELECT h.bucket, h.sum / h.count, h.min, h.max, h.sum, h.count::bigint
        FROM samples_1h AS h
        WHERE tuneloop_resolution(p_from, p_to, p_interval_ms) = 3600
          AND p_interval_ms <= 3600000
          AND h.series_id = s.id
          AND h.bucket >= date_bin('1 hour', p_from, 'epoch'::timestamptz)
          AND h.bucket <= p_to
          AND h.bucket < tuneloop_watermark(3600)
        UNION ALL
        SELECT date_bin(
                   make_interval(secs => greatest(
                       p_interval_ms / 1000.0, tuneloop_resolution(p_from, p_to, p_interval_ms))),
                   f.bucket, 'epoch'::timestamptz),
               sum(f.sum) / sum(f.count), min(f.min), max(f.max), sum(f.sum),
               sum(f.count)::bigint
        FROM (
            SELECT h.bucket, h.count, h.sum, h.min, h.max
            FROM samples_1h AS h
            WHERE tuneloop_resolution(p_from, p_to, p_interval_ms) = 3600
              AND p_interval_ms > 3600000
              AND h.series_id = s.id
              AND h.bucket >= date_bin('1 hour', p_from, 'epoch'::timestamptz)
              AND h.bucket <= p_to
              AND h.bucket < tuneloop_watermark(3600)
            UNION ALL
            SELECT m.bucket, m.count, m.sum, m.min, m.max
            FROM samples_1m AS m
            WHERE tuneloop_resolution(p_from, p_to, p_interval_ms) >= 60
              AND m.series_id = s.id
              AND m.bucket >= date_bin('1 minute', p_from, 'epoch'::timestamptz)
              AND m.bucket >= CASE WHEN tuneloop_resolution(p_from, p_to, p_interval_ms) = 3600
                                   THEN tuneloop_watermark(3600)
                                   ELSE '-infinity'::timestamptz END
              AND m.bucket <= p_to
              AND m.bucket < tuneloop_watermark(60)
            UNION ALL
            SELECT x.ts, 1, x.value, x.value, x.value
            FROM samples AS x
            WHERE x.series_id = s.id
              AND x.ts >= p_from
              AND x.ts >= CASE WHEN tuneloop_resolution(p_from, p_to, p_interval_ms) >= 60
                               THEN tuneloop_watermark(60)
                               ELSE '-infinity'::timestamptz END
              AND x.ts <= p_to
        ) AS f
        GROUP BY 1
    ) AS r (bucket, avg, min, max, sum, count)
    WHERE p.name = p_project AND s.metric = p_metric
$fn$
"""

# Revision 0005's version, spelled out so that a downgrade restores exactly what it created.
_PREVIOUS_SERIES = """
CREATE OR REPLACE FUNCTION tuneloop_series(
    p_project text, p_metric text, p_from timestamptz, p_to timestamptz, p_interval_ms bigint
) RETURNS TABLE (
    series_id bigint, labels jsonb, bucket timestamptz, avg double precision,
    min double precision, max double precision, sum double precision, count bigint
) LANGUAGE sql STABLE AS $fn$
    SELECT s.id, s.labels,
           date_bin(
               make_interval(secs => greatest(
                   p_interval_ms / 1000.0, tuneloop_resolution(p_from, p_to, p_interval_ms))),
               r.bucket, 'epoch'::timestamptz) AS bucket,
           sum(r.sum) / sum(r.count), min(r.min), max(r.max), sum(r.sum), sum(r.count)::bigint
    FROM series AS s
    JOIN projects AS p ON p.id = s.project_id
    CROSS JOIN LATERAL (
        SELECT h.bucket, h.count, h.sum, h.min, h.max
        FROM samples_1h AS h
        WHERE tuneloop_resolution(p_from, p_to, p_interval_ms) = 3600
          AND h.series_id = s.id
          AND h.bucket >= date_bin('1 hour', p_from, 'epoch'::timestamptz)
          AND h.bucket <= p_to
          AND h.bucket < tuneloop_watermark(3600)
        UNION ALL
        SELECT m.bucket, m.count, m.sum, m.min, m.max
        FROM samples_1m AS m
        WHERE tuneloop_resolution(p_from, p_to, p_interval_ms) >= 60
          AND m.series_id = s.id
          AND m.bucket >= date_bin('1 minute', p_from, 'epoch'::timestamptz)
          AND m.bucket >= CASE WHEN tuneloop_resolution(p_from, p_to, p_interval_ms) = 3600
                               THEN tuneloop_watermark(3600)
                               ELSE '-infinity'::timestamptz END
          AND m.bucket <= p_to
          AND m.bucket < tuneloop_watermark(60)
        UNION ALL
        SELECT x.ts, 1, x.value, x.value, x.value
        FROM samples AS x
        WHERE x.series_id = s.id
          AND x.ts >= p_from
          AND x.ts >= CASE WHEN tuneloop_resolution(p_from, p_to, p_interval_ms) >= 60
                           THEN tuneloop_watermark(60)
                           ELSE '-infinity'::timestamptz END
          AND x.ts <= p_to
    ) AS r
    WHERE p.name = p_project AND s.metric = p_metric
    GROUP BY 3, s.id
$fn$
"""

_COVERED = "count, sum, min, max"
"""The columns of ``samples_1h`` that ``tuneloop_series`` reads besides the key."""


def _primary_key(include: str | None) -> None:
    clause = f" INCLUDE ({include})" if include else ""
    op.execute(
        "ALTER TABLE samples_1h DROP CONSTRAINT pk_samples_1h, "
        f"ADD CONSTRAINT pk_samples_1h PRIMARY KEY (series_id, bucket){clause}"
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _primary_key(_COVERED)
    op.execute(_SERIES)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_PREVIOUS_SERIES)
    _primary_key(None)
