"""The Cost dashboard's functions: only the raw rows grouped into minutes, and minutes priced
per price-change segment rather than joined to price regimes one by one.

``tuneloop_gpu_usage`` (0015) and ``tuneloop_gpu_cost`` (0012) built each GPU's minutes by
grouping ``samples_1m`` rows and raw rows together by (series, minute). Before the 1-minute
watermark a minute is already one ``samples_1m`` row, and raw rows are read only from the
watermark on, so the two never share a minute: grouping the rollup rows sorted or hashed a
week of 1,000 GPUs (10 M groups, spilling at the default ``work_mem``) for nothing. Now only
the raw rows after the watermark are grouped, and the rollup rows pass through, with the same
``sum / count`` per minute: the answers are the same to the bit (BENCHMARKS.md, "Dashboard
query over 7 days").

SQLite has no stored functions: nothing changes there.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25 21:00:00
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The minutes CTE as 0011 wrote it and 0012 and 0015 copied it, and what replaces it.
GROUPED_MINUTES = """    minutes AS (
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
    ),"""

# The watermark is a whole minute: every raw bucket is at or after it, every rollup row before.
MINUTES = """    minutes AS (
        SELECT m.series_id, m.bucket, m.sum / m.count::bigint AS util
        FROM samples_1m AS m JOIN gpus AS g ON g.id = m.series_id
        WHERE m.bucket >= p_from AND m.bucket < p_to AND m.bucket < tuneloop_watermark(60)
        UNION ALL
        SELECT x.series_id, date_bin('1 minute', x.ts, 'epoch'::timestamptz),
               sum(x.value) / count(*)
        FROM samples AS x JOIN gpus AS g ON g.id = x.series_id
        WHERE x.ts >= greatest(date_bin('1 minute', p_from, 'epoch'::timestamptz),
                               tuneloop_watermark(60))
          AND x.ts < p_to
        GROUP BY 1, 2
        HAVING date_bin('1 minute', x.ts, 'epoch'::timestamptz) >= p_from
    ),"""


# 0012 priced each minute by joining it to its GPU's price regimes on a time range: a join
# PostgreSQL ran as a nested loop over every (regime, minute) pair (its estimates of the CTEs
# are a few rows), 6.6 M comparisons for 96 GPUs over 12 hours, quadratic in the fleet. Now
# each minute gets the index of the price-change segment it falls in (``width_bucket`` over the
# few moments in the range at which any price row of the GPUs' projects takes effect), minutes
# are counted per (GPU, segment), and each segment is priced once, by the row in force at its
# start. A segment boundary where the GPU's own price does not change leaves the price as it
# was, so the sums are those of 0012 (numeric, exact).
COST_REGIMES = """    used AS (SELECT DISTINCT series_id FROM minutes),
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
    )"""

COST_SEGMENTS = """    changes AS (
        SELECT coalesce(array_agg(DISTINCT r.valid_from ORDER BY r.valid_from),
                        '{}'::timestamptz[]) AS at
        FROM gpu_prices AS r
        WHERE r.valid_from > p_from AND r.valid_from < p_to
          AND (r.project_id IS NULL OR r.project_id IN (SELECT project_id FROM gpus))
    ),
    counted AS (
        SELECT m.series_id, width_bucket(m.bucket, c.at) AS segment,
               count(*) AS minutes,
               count(*) FILTER (WHERE m.util < p_idle_below / g.scale) AS idle_minutes
        FROM minutes AS m JOIN gpus AS g ON g.id = m.series_id CROSS JOIN changes AS c
        GROUP BY 1, 2
    ),
    used AS (SELECT DISTINCT series_id FROM counted),
    shares AS (
        SELECT coalesce(g.labels->>'Hostname', '') AS host,
               coalesce(g.labels->>'UUID', '') AS uuid,
               count(DISTINCT g.labels->>'GPU_I_ID') AS instances
        FROM gpus AS g JOIN used AS u ON u.series_id = g.id
        WHERE g.labels->>'GPU_I_ID' IS NOT NULL
        GROUP BY 1, 2
    ),
    money AS (
        SELECT k.series_id,
               bool_or(r.price_per_gpu_hour IS NULL) AS unpriced,
               min(r.currency) AS currency,
               sum(r.price_per_gpu_hour * k.minutes) AS price_minutes,
               sum(r.price_per_gpu_hour * k.idle_minutes) AS idle_price_minutes
        FROM counted AS k
        JOIN gpus AS g ON g.id = k.series_id
        CROSS JOIN changes AS c
        LEFT JOIN LATERAL (
            SELECT r.price_per_gpu_hour, r.currency FROM gpu_prices AS r
            WHERE (r.project_id IS NULL OR r.project_id = g.project_id)
              AND r.capacity_type = g.capacity
              AND (r.model = g.model
                   OR (right(r.model, 1) = '*' AND starts_with(g.model, left(r.model, -1))))
              AND (r.valid_from IS NULL
                   OR r.valid_from <= CASE WHEN k.segment = 0 THEN p_from
                                           ELSE c.at[k.segment] END)
            ORDER BY r.project_id IS NULL, right(r.model, 1) = '*', length(r.model) DESC,
                     r.valid_from DESC NULLS LAST, r.id DESC
            LIMIT 1
        ) AS r ON true
        GROUP BY k.series_id
    )"""


def _migration(file_name: str) -> ModuleType:
    """An earlier revision's module (its name starts with a digit: loaded from its file)."""
    path = Path(__file__).with_name(file_name)
    spec = importlib.util.spec_from_file_location(f"tuneloop_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rewritten(definition: str, *replacements: tuple[str, str]) -> str:
    for before, after in replacements:
        if definition.count(before) != 1:
            raise RuntimeError("the function is not the one this migration rewrites")
        definition = definition.replace(before, after)
    return definition


def _previous() -> tuple[str, str]:
    """0015's ``tuneloop_gpu_usage`` and 0012's ``tuneloop_gpu_cost``, both replaceable."""
    usage = _migration("0015_functions_over_chunks.py")._GPU_USAGE
    cost = _migration("0012_gpu_prices.py").GPU_COST
    return usage, cost.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        usage, cost = _previous()
        op.execute(_rewritten(usage, (GROUPED_MINUTES, MINUTES)))
        op.execute(_rewritten(cost, (GROUPED_MINUTES, MINUTES), (COST_REGIMES, COST_SEGMENTS)))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for definition in _previous():
            op.execute(definition)
