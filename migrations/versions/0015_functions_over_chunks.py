"""The dashboards' SQL functions answer over compacted samples (docs/storage.md, "Compacted
chunks").

Compaction (0013) turns old raw rows into pcodec chunks, which SQL cannot decode. Two functions
read raw rows before the 1-minute watermark and so were blind to compacted spans:

- ``tuneloop_series``' raw branch (a panel's interval under a minute, e.g. an hour of yesterday
  at 15 s): inside the spans a series has chunks for, it now reads that series' ``samples_1m``
  rows, one bucket a minute (at the minute's start), besides the raw rows that still exist.
  Its other branches read only rollups and raw rows after the watermark, which compaction
  never touches: they are unchanged.
- ``tuneloop_gpu_usage``' energy: a new column, ``samples_1m.increase``, holds the energy
  counter's growth over the pairs of consecutive samples whose later sample lies in the minute
  (``tuneloop.storage.timeseries.counter_increase``; the 1-minute rollup pass fills it from raw
  rows). Before the end of a counter's newest chunk the function sums the increases of the
  minutes starting in the range; after it, it pairs raw rows as before, the first one with the
  ``last`` of the minute before.

The migration adds the column (on SQLite too, where it stays NULL: no stored functions there)
and, on PostgreSQL, fills it for the counters' existing 1-minute rows from every sample the
store holds, chunks included, a day of up to 100 counters per statement, with progress lines.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 20:00:00
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

from tuneloop.storage.timeseries.counter_increase import fill_increase

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0007's function with one more branch, the fourth: for a resolution under a minute, the
# 1-minute rows inside the series' chunks (the chunk probe is bounded as sample_source's: no
# chunk spans more than a day). The rollup pass runs before compaction, and a minute inside a
# chunk is never rolled up again, so no sample is counted both from a row and from a minute.
# DISTINCT: a series' chunks of two widths may share a day's time (chunk_widths.py), and a
# minute inside both is one minute.
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
            SELECT DISTINCT m.bucket, m.count, m.sum, m.min, m.max
            FROM sample_chunks AS c
            JOIN samples_1m AS m
              ON m.series_id = c.series_id AND m.bucket >= c.start_ts AND m.bucket < c.end_ts
            WHERE tuneloop_resolution(p_from, p_to, p_interval_ms) < 60
              AND c.series_id = s.id
              AND c.start_ts > date_bin('1 minute', p_from, 'epoch'::timestamptz)
                               - interval '1 day'
              AND c.start_ts <= p_to
              AND c.end_ts > date_bin('1 minute', p_from, 'epoch'::timestamptz)
              AND m.bucket >= date_bin('1 minute', p_from, 'epoch'::timestamptz)
              AND m.bucket <= p_to
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

# 0011's function, its energy part split at each counter's compaction frontier (the latest end
# of its chunks starting before p_to, looked for in the day before the newest one to start, as
# a wider chunk of that day may span it; -infinity without chunks, which gives 0011's figures):
# before it, the increases of the minutes starting in [p_from, p_to); after it, raw rows
# paired as in 0011, the first with the last sample of the minute before the frontier. Raw
# rows before the frontier are late samples not yet merged into their chunk, which no rollup
# holds either: left out, as the usage minutes leave them out.
_GPU_USAGE = """
CREATE OR REPLACE FUNCTION tuneloop_gpu_usage(
    p_project text, p_from timestamptz, p_to timestamptz,
    p_idle_below double precision DEFAULT 5.0
) RETURNS TABLE (
    labels jsonb, job text, team text, namespace text, pod text,
    gpu_seconds double precision, idle_gpu_seconds double precision,
    energy_joules double precision
) LANGUAGE sql STABLE AS $fn$
    WITH project_series AS (
        SELECT s.id, s.labels, s.project_id, s.metric
        FROM series AS s JOIN projects AS p ON p.id = s.project_id
        WHERE p.name = p_project
          AND s.metric IN ('DCGM_FI_DEV_GPU_UTIL', 'DCGM_FI_PROF_GR_ENGINE_ACTIVE',
                           'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION')
    ),
    whole AS (
        SELECT id, labels, project_id, 1.0::double precision AS scale
        FROM project_series WHERE metric = 'DCGM_FI_DEV_GPU_UTIL'
    ),
    gpus AS (
        SELECT * FROM whole
        UNION ALL
        SELECT a.id, a.labels, a.project_id, 100.0::double precision
        FROM project_series AS a
        WHERE a.metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE'
          AND NOT EXISTS (SELECT 1 FROM whole AS w WHERE w.labels = a.labels)
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
        SELECT m.series_id, 60.0 * count(*) AS gpu_seconds,
               60.0 * count(*) FILTER (WHERE m.util < p_idle_below / g.scale)
                   AS idle_gpu_seconds
        FROM minutes AS m JOIN gpus AS g ON g.id = m.series_id
        GROUP BY m.series_id
    ),
    counters AS (
        SELECT id, labels FROM project_series
        WHERE metric = 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION'
    ),
    shares AS (
        SELECT coalesce(labels->>'Hostname', '') AS host, coalesce(labels->>'UUID', '') AS uuid,
               count(DISTINCT labels->>'GPU_I_ID') AS instances
        FROM counters WHERE labels->>'GPU_I_ID' IS NOT NULL
        GROUP BY 1, 2
    ),
    gpu_counters AS (
        SELECT c.id, g.id AS gpu_id,
               coalesce((
                   SELECT max(k.end_ts) FROM sample_chunks AS k
                   WHERE k.series_id = c.id AND k.start_ts < p_to
                     AND k.start_ts > (
                         SELECT n.start_ts FROM sample_chunks AS n
                         WHERE n.series_id = c.id AND n.start_ts < p_to
                         ORDER BY n.start_ts DESC LIMIT 1
                     ) - interval '1 day'
               ), '-infinity'::timestamptz) AS compacted_until
        FROM counters AS c JOIN gpus AS g ON g.labels = c.labels
    ),
    rolled AS (
        SELECT c.gpu_id, m.increase AS millijoules
        FROM gpu_counters AS c JOIN samples_1m AS m ON m.series_id = c.id
        WHERE m.bucket >= p_from AND m.bucket < least(c.compacted_until, p_to)
          AND m.increase IS NOT NULL
    ),
    points AS (
        SELECT x.series_id, x.ts, x.value
        FROM samples AS x JOIN gpu_counters AS c ON c.id = x.series_id
        WHERE x.ts >= greatest(p_from, c.compacted_until) - interval '1 hour'
          AND x.ts >= c.compacted_until AND x.ts < p_to
        UNION ALL
        SELECT c.id, b.last_ts, b.last
        FROM gpu_counters AS c
        CROSS JOIN LATERAL (
            SELECT m.last_ts, m.last FROM samples_1m AS m
            WHERE m.series_id = c.id AND m.bucket < c.compacted_until
            ORDER BY m.bucket DESC LIMIT 1
        ) AS b
        WHERE c.compacted_until < p_to
          AND b.last_ts >= greatest(p_from, c.compacted_until) - interval '1 hour'
    ),
    paired AS (
        SELECT series_id, ts, value,
               lag(value) OVER (PARTITION BY series_id ORDER BY ts) AS previous
        FROM points
    ),
    energy AS (
        SELECT gpu_id, sum(millijoules) AS millijoules
        FROM (
            SELECT c.gpu_id,
                   sum(CASE WHEN value >= previous THEN value - previous ELSE value END)
                       AS millijoules
            FROM paired JOIN gpu_counters AS c ON c.id = paired.series_id
            WHERE ts >= p_from AND previous IS NOT NULL
            GROUP BY c.gpu_id
            UNION ALL
            SELECT gpu_id, sum(millijoules) FROM rolled GROUP BY gpu_id
        ) AS parts
        GROUP BY gpu_id
    )
    SELECT g.labels,
           coalesce(g.labels->>'job', '') AS job,
           coalesce(g.labels->>'team', j.labels->>'team', '') AS team,
           coalesce(g.labels->>'namespace', '') AS namespace,
           coalesce(g.labels->>'pod', '') AS pod,
           coalesce(u.gpu_seconds, 0), coalesce(u.idle_gpu_seconds, 0),
           coalesce(e.millijoules / CASE WHEN g.labels->>'GPU_I_ID' IS NULL THEN 1
                                         ELSE coalesce(sh.instances, 1) END / 1000.0, 0)
    FROM gpus AS g
    LEFT JOIN usage AS u ON u.series_id = g.id
    LEFT JOIN energy AS e ON e.gpu_id = g.id
    LEFT JOIN shares AS sh
        ON sh.host = coalesce(g.labels->>'Hostname', '')
       AND sh.uuid = coalesce(g.labels->>'UUID', '')
    LEFT JOIN jobs AS j ON j.project_id = g.project_id AND j.name = g.labels->>'job'
    WHERE u.series_id IS NOT NULL OR e.gpu_id IS NOT NULL
$fn$
"""


def _migration(file_name: str) -> ModuleType:
    """An earlier revision's module (its name starts with a digit: loaded from its file)."""
    path = Path(__file__).with_name(file_name)
    spec = importlib.util.spec_from_file_location(f"tuneloop_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def upgrade() -> None:
    with op.batch_alter_table("samples_1m") as batch:
        batch.add_column(sa.Column("increase", sa.Float(precision=53), nullable=True))
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute(_SERIES)
    op.execute(_GPU_USAGE)
    watermark = bind.execute(
        sa.text("SELECT watermark FROM rollup_state WHERE resolution_s = 60")
    ).scalar()
    if watermark is not None:
        fill_increase(bind, watermark, progress=_say)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_migration("0007_series_reads.py")._SERIES)
        op.execute(
            _migration("0011_cost_mig.py").GPU_USAGE.replace(
                "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
            )
        )
    with op.batch_alter_table("samples_1m") as batch:
        batch.drop_column("increase")
