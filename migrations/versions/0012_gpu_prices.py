"""GPU prices: the price of a GPU-hour per accelerator model and capacity type (on-demand,
spot, reserved), server-wide or per project, and the capacity type of hosts, so the cost view
reports money next to GPU-hours and energy (``tuneloop.prices``, ``tuneloop.priced_cost``).

On PostgreSQL the Cost dashboard's money panels read ``tuneloop_gpu_cost``, which prices each
GPU's in-use minutes (counted as ``tuneloop_gpu_usage`` counts them, migration 0011) by the row
in force at each minute, in the API's order of precedence; ``cost`` is null for a GPU with
minutes no row prices. A GPU's capacity type is its ``capacity_type`` label, else its host's
in ``gpu_host_capacity`` (the price file's ``host`` rows), else on-demand. SQLite has no
stored functions and the API does not need them.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tuneloop.storage.types import UTCDateTime

COST_SIGNATURE = "tuneloop_gpu_cost(text, timestamptz, timestamptz, double precision)"

# The minutes as 0011's tuneloop_gpu_usage counts them; each priced by the row in force at its
# start (a row's valid_from is a whole minute). The moments a price can change are few, so a
# GPU's minutes are joined to its price regimes rather than looked up one by one.
GPU_COST = """
CREATE FUNCTION tuneloop_gpu_cost(
    p_project text, p_from timestamptz, p_to timestamptz,
    p_idle_below double precision DEFAULT 5.0
) RETURNS TABLE (
    labels jsonb, job text, team text, namespace text, pod text, currency text,
    cost numeric, idle_cost numeric
) LANGUAGE sql STABLE AS $fn$
    WITH project_series AS (
        SELECT s.id, s.labels, s.project_id, s.metric
        FROM series AS s JOIN projects AS p ON p.id = s.project_id
        WHERE p.name = p_project
          AND s.metric IN ('DCGM_FI_DEV_GPU_UTIL', 'DCGM_FI_PROF_GR_ENGINE_ACTIVE')
    ),
    whole AS (
        SELECT id, labels, project_id, 1.0::double precision AS scale
        FROM project_series WHERE metric = 'DCGM_FI_DEV_GPU_UTIL'
    ),
    gpus AS (
        SELECT g.*, coalesce(g.labels->>'modelName', '') AS model,
               CASE WHEN replace(lower(trim(g.labels->>'capacity_type')), '-', '_')
                         IN ('on_demand', 'spot', 'reserved')
                    THEN replace(lower(trim(g.labels->>'capacity_type')), '-', '_')
                    ELSE coalesce((
                        SELECT h.capacity_type FROM gpu_host_capacity AS h
                        WHERE h.host = g.labels->>'Hostname'
                          AND (h.project_id IS NULL OR h.project_id = g.project_id)
                        ORDER BY h.project_id IS NULL, h.id DESC LIMIT 1
                    ), 'on_demand') END AS capacity
        FROM (
            SELECT * FROM whole
            UNION ALL
            SELECT a.id, a.labels, a.project_id, 100.0::double precision
            FROM project_series AS a
            WHERE a.metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE'
              AND NOT EXISTS (SELECT 1 FROM whole AS w WHERE w.labels = a.labels)
        ) AS g
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
    used AS (SELECT DISTINCT series_id FROM minutes),
    shares AS (
        SELECT coalesce(g.labels->>'Hostname', '') AS host,
               coalesce(g.labels->>'UUID', '') AS uuid,
               count(DISTINCT g.labels->>'GPU_I_ID') AS instances
        FROM gpus AS g JOIN used AS u ON u.series_id = g.id
        WHERE g.labels->>'GPU_I_ID' IS NOT NULL
        GROUP BY 1, 2
    ),
    points AS (
        SELECT g.id AS gpu_id, p_from AS since FROM gpus AS g JOIN used AS u ON u.series_id = g.id
        UNION
        SELECT g.id, r.valid_from
        FROM gpus AS g JOIN used AS u ON u.series_id = g.id
        JOIN gpu_prices AS r ON r.project_id IS NULL OR r.project_id = g.project_id
        WHERE r.valid_from > p_from AND r.valid_from < p_to
    ),
    regimes AS (
        SELECT pt.gpu_id, pt.since,
               lead(pt.since, 1, p_to) OVER (PARTITION BY pt.gpu_id ORDER BY pt.since) AS until,
               r.price_per_gpu_hour AS price, r.currency
        FROM points AS pt JOIN gpus AS g ON g.id = pt.gpu_id
        LEFT JOIN LATERAL (
            SELECT r.price_per_gpu_hour, r.currency FROM gpu_prices AS r
            WHERE (r.project_id IS NULL OR r.project_id = g.project_id)
              AND r.capacity_type = g.capacity
              AND (r.model = g.model
                   OR (right(r.model, 1) = '*' AND starts_with(g.model, left(r.model, -1))))
              AND (r.valid_from IS NULL OR r.valid_from <= pt.since)
            ORDER BY r.project_id IS NULL, right(r.model, 1) = '*', length(r.model) DESC,
                     r.valid_from DESC NULLS LAST, r.id DESC
            LIMIT 1
        ) AS r ON true
    ),
    money AS (
        SELECT m.series_id,
               bool_or(r.price IS NULL) AS unpriced,
               min(r.currency) AS currency,
               sum(r.price) AS price_minutes,
               sum(r.price) FILTER (WHERE m.util < p_idle_below / g.scale) AS idle_price_minutes
        FROM minutes AS m
        JOIN gpus AS g ON g.id = m.series_id
        JOIN regimes AS r
            ON r.gpu_id = m.series_id AND m.bucket >= r.since AND m.bucket < r.until
        GROUP BY m.series_id
    )
    SELECT g.labels,
           coalesce(g.labels->>'job', '') AS job,
           coalesce(g.labels->>'team', j.labels->>'team', '') AS team,
           coalesce(g.labels->>'namespace', '') AS namespace,
           coalesce(g.labels->>'pod', '') AS pod,
           mo.currency,
           CASE WHEN NOT mo.unpriced THEN mo.price_minutes / 60
               / CASE WHEN g.labels->>'GPU_I_ID' IS NULL THEN 1 ELSE sh.instances END END,
           CASE WHEN NOT mo.unpriced THEN coalesce(mo.idle_price_minutes, 0) / 60
               / CASE WHEN g.labels->>'GPU_I_ID' IS NULL THEN 1 ELSE sh.instances END END
    FROM gpus AS g
    JOIN money AS mo ON mo.series_id = g.id
    LEFT JOIN shares AS sh
        ON sh.host = coalesce(g.labels->>'Hostname', '')
       AND sh.uuid = coalesce(g.labels->>'UUID', '')
    LEFT JOIN jobs AS j ON j.project_id = g.project_id AND j.name = g.labels->>'job'
$fn$
"""


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
    op.create_table(
        "gpu_host_capacity",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("host", sa.String(length=253), nullable=False),
        sa.Column("capacity_type", sa.String(length=20), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "capacity_type IN ('on_demand', 'spot', 'reserved')",
            name=op.f("ck_gpu_host_capacity_capacity"),
        ),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_gpu_host_capacity_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_host_capacity")),
    )
    op.create_index("ix_gpu_host_capacity_host", "gpu_host_capacity", ["host"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(GPU_COST)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {COST_SIGNATURE}")
    op.drop_index("ix_gpu_host_capacity_host", table_name="gpu_host_capacity")
    op.drop_table("gpu_host_capacity")
    op.drop_index("ix_gpu_prices_project_id", table_name="gpu_prices")
    op.drop_table("gpu_prices")
