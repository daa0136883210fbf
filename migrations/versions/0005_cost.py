"""Cost accounting and dashboard support (issue: dashboards).

SQL functions the Grafana dashboards call through the PostgreSQL data source, so panel SQL
stays short and reads the rollups for long ranges:

- ``tuneloop_series(project, metric, from, to, interval_ms)``: every series of one metric
  aggregated per time bucket (avg, min, max, sum, count), from ``samples_1h`` when the
  panel's interval is an hour or more or the range three days or more, from ``samples_1m``
  when the interval is a minute or more or the range six hours or more, else from raw
  samples; the part of the range the rollups do not cover yet (after their watermarks) is
  read from the next finer level, so recent data is never missing. Buckets are the panel's
  interval, or the rollup's width when that is coarser, aligned to the epoch as
  ``$__timeGroup`` aligns them: a panel selects and names series, and needs no GROUP BY.
- ``tuneloop_gpu_usage(project, from, to, idle_below)``: per GPU, the minutes it reported
  utilization in ``[from, to)`` (GPU time), those whose average utilization was below
  ``idle_below`` percent (idle GPU time) and the energy it used (increase of the DCGM
  energy counter, millijoules, reset-aware), with the job and team it is attributed to.
  The API computes the same figures on both backends (``tuneloop.cost``).

Only PostgreSQL gets them: Grafana reads the store through PostgreSQL; SQLite has no stored
functions and the API does not need them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each function is one SQL statement marked STABLE, so PostgreSQL inlines it into the panel's
# query: the panel's WHERE on labels reaches the series scan, and the branches whose
# resolution was not picked are pruned as one-time filters. The function groups by
# (bucket, series id) once over the rows of all selected series (read per series through the
# lateral, as index range scans): PostgreSQL sorts them in that order and aggregates, so a
# panel's ORDER BY bucket, series_id needs no second sort. Grouping each series inside the
# lateral instead (a hash per series, then a sort of the whole result) took about 15% more
# server time for a week of 1,000 series; a panel grouping the rows itself by Grafana's
# numeric time and a text name took three times as long.
_WATERMARK = """
CREATE FUNCTION tuneloop_watermark(p_resolution_s integer) RETURNS timestamptz
LANGUAGE sql STABLE AS $fn$
    SELECT coalesce(
        (SELECT watermark FROM rollup_state WHERE resolution_s = p_resolution_s),
        '-infinity'::timestamptz)
$fn$
"""

_RESOLUTION = """
CREATE FUNCTION tuneloop_resolution(p_from timestamptz, p_to timestamptz, p_interval_ms bigint)
RETURNS integer LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE
        WHEN p_interval_ms >= 3600000 OR p_to - p_from >= interval '3 days' THEN 3600
        WHEN p_interval_ms >= 60000 OR p_to - p_from >= interval '6 hours' THEN 60
        ELSE 0
    END
$fn$
"""

_SERIES = """
CREATE FUNCTION tuneloop_series(
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

_GPU_USAGE = """
CREATE FUNCTION tuneloop_gpu_usage(
    p_project text, p_from timestamptz, p_to timestamptz,
    p_idle_below double precision DEFAULT 5.0
) RETURNS TABLE (
    labels jsonb, job text, team text,
    gpu_seconds double precision, idle_gpu_seconds double precision,
    energy_joules double precision
) LANGUAGE sql STABLE AS $fn$
    WITH gpus AS (
        SELECT s.id, s.labels, s.project_id
        FROM series AS s JOIN projects AS p ON p.id = s.project_id
        WHERE p.name = p_project AND s.metric = 'DCGM_FI_DEV_GPU_UTIL'
    ),
    minutes AS (
        SELECT series_id, bucket, sum(sum) / sum(count) AS util
        FROM (
            SELECT m.series_id, m.bucket, m.sum, m.count::bigint AS count
            FROM samples_1m AS m JOIN gpus AS g ON g.id = m.series_id
            WHERE m.bucket >= p_from AND m.bucket < p_to AND m.bucket < tuneloop_watermark(60)
            UNION ALL
            SELECT x.series_id, date_bin('1 minute', x.ts, 'epoch'::timestamptz), x.value, 1
            FROM samples AS x JOIN gpus AS g ON g.id = x.series_id
            WHERE x.ts >= greatest(date_bin('1 minute', p_from, 'epoch'::timestamptz),
                                   tuneloop_watermark(60))
              AND x.ts < p_to
        ) AS partials
        WHERE bucket >= p_from
        GROUP BY series_id, bucket
    ),
    usage AS (
        SELECT series_id, 60.0 * count(*) AS gpu_seconds,
               60.0 * count(*) FILTER (WHERE util < p_idle_below) AS idle_gpu_seconds
        FROM minutes GROUP BY series_id
    ),
    counters AS (
        SELECT s.id, s.labels
        FROM series AS s JOIN gpus AS g ON g.project_id = s.project_id AND g.labels = s.labels
        WHERE s.metric = 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION'
    ),
    paired AS (
        SELECT x.series_id, x.ts, x.value,
               lag(x.value) OVER (PARTITION BY x.series_id ORDER BY x.ts) AS previous
        FROM samples AS x JOIN counters AS c ON c.id = x.series_id
        WHERE x.ts >= p_from - interval '1 hour' AND x.ts < p_to
    ),
    energy AS (
        SELECT c.labels,
               sum(CASE WHEN value >= previous THEN value - previous ELSE value END) / 1000.0
                   AS joules
        FROM paired JOIN counters AS c ON c.id = paired.series_id
        WHERE ts >= p_from AND previous IS NOT NULL
        GROUP BY c.labels
    )
    SELECT g.labels,
           coalesce(g.labels->>'job', '') AS job,
           coalesce(g.labels->>'team', j.labels->>'team', '') AS team,
           coalesce(u.gpu_seconds, 0), coalesce(u.idle_gpu_seconds, 0),
           coalesce(e.joules, 0)
    FROM gpus AS g
    LEFT JOIN usage AS u ON u.series_id = g.id
    LEFT JOIN energy AS e ON e.labels = g.labels
    LEFT JOIN jobs AS j ON j.project_id = g.project_id AND j.name = g.labels->>'job'
    WHERE u.series_id IS NOT NULL OR e.labels IS NOT NULL
$fn$
"""

_FUNCTIONS = {
    "tuneloop_watermark(integer)": _WATERMARK,
    "tuneloop_resolution(timestamptz, timestamptz, bigint)": _RESOLUTION,
    "tuneloop_series(text, text, timestamptz, timestamptz, bigint)": _SERIES,
    "tuneloop_gpu_usage(text, timestamptz, timestamptz, double precision)": _GPU_USAGE,
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in _FUNCTIONS.values():
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for signature in reversed(_FUNCTIONS):
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
