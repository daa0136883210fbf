"""The Cost dashboard's ``tuneloop_gpu_usage`` counts MIG instances and names each GPU's
namespace and pod, as the API does (``tuneloop.cost``).

Migration 0005's function counted only ``DCGM_FI_DEV_GPU_UTIL`` series, which MIG instances do
not report. This one, with the same arguments, also counts every
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` series without a ``DCGM_FI_DEV_GPU_UTIL`` series of the same
labels (a MIG instance, or a GPU whose exporter sends only the profiling field): its minutes
are in use when it reported activity, idle when the active ratio is below ``idle_below / 100``.
The instances of a MIG GPU each report the whole GPU's energy counter, so each gets an equal
share of it (the distinct ``GPU_I_ID`` values reporting the counter of the same ``Hostname``
and ``UUID``). Two columns are added, ``namespace`` and ``pod`` (dcgm-exporter's labels, ''
when absent), which changes the function's result type: it is dropped and created again.

PostgreSQL only, as 0005: SQLite has no stored functions and the API does not need them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 15:00:00
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = "tuneloop_gpu_usage(text, timestamptz, timestamptz, double precision)"

# One STABLE SQL statement, as 0005's, so PostgreSQL inlines it into the panel's query. Energy
# is divided in millijoules before the conversion to joules, in the API's order, so both give
# the same floating-point figures.
GPU_USAGE = """
CREATE FUNCTION tuneloop_gpu_usage(
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
        SELECT c.id, g.id AS gpu_id
        FROM counters AS c JOIN gpus AS g ON g.labels = c.labels
    ),
    paired AS (
        SELECT x.series_id, x.ts, x.value,
               lag(x.value) OVER (PARTITION BY x.series_id ORDER BY x.ts) AS previous
        FROM samples AS x JOIN gpu_counters AS c ON c.id = x.series_id
        WHERE x.ts >= p_from - interval '1 hour' AND x.ts < p_to
    ),
    energy AS (
        SELECT c.gpu_id,
               sum(CASE WHEN value >= previous THEN value - previous ELSE value END)
                   AS millijoules
        FROM paired JOIN gpu_counters AS c ON c.id = paired.series_id
        WHERE ts >= p_from AND previous IS NOT NULL
        GROUP BY c.gpu_id
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


def _previous_definition() -> str:
    """Migration 0005's function (its module name starts with a digit: loaded from its file)."""
    path = Path(__file__).with_name("0005_cost.py")
    spec = importlib.util.spec_from_file_location("tuneloop_migration_0005", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module._GPU_USAGE)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    op.execute(GPU_USAGE)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    op.execute(_previous_definition())
