"""SQL snippets the panels share: a metric's series from ``tuneloop_series`` and the
queries that select, group or rate them per time bucket."""

# Panel SQL is assembled from this package's own constants; Grafana fills in the variables.
# ruff: noqa: S608

from __future__ import annotations


def series_of(metric: str) -> str:
    return (
        f"tuneloop_series(${{project:sqlstring}}, '{metric}', "
        "$__timeFrom(), $__timeTo(), $__interval_ms)"
    )


# dcgm-exporter's label names: ``Hostname`` (not ``hostname``), ``gpu``.
GPU_FILTER = "labels->>'Hostname' IN (${host:sqlstring}) AND labels->>'gpu' IN (${gpu:sqlstring})"
# A MIG instance is a series of its own: its profile and instance id keep its line apart from
# its siblings' (the text is NULL, so nothing is added, for a whole GPU).
GPU_NAME = (
    "(labels->>'Hostname') || ' gpu ' || (labels->>'gpu')"
    " || coalesce(' ' || (labels->>'GPU_I_PROFILE') || ' ' || (labels->>'GPU_I_ID'), '')"
)
JOB_FILTER = "labels->>'job' = ${job:sqlstring}"


# Time series are ordered by time alone: Grafana turns the rows into one field per series
# (LongToWide), which needs ascending time and sorts the fields by name itself, so the order
# of series within a bucket shows nowhere. A second sort key costs a tie-break on almost
# every comparison: a third of the server time of a week of 1,000 series (BENCHMARKS.md).


def gauge_sql(metric: str, name: str, where: str, value: str = "avg") -> str:
    """One line per series of ``metric``: its ``value`` (avg, min, max) per time bucket."""
    return (
        f"SELECT $__time(bucket), {name} AS metric, {value} AS value\n"
        f"FROM {series_of(metric)}\n"
        f"WHERE {where}\n"
        "ORDER BY bucket"
    )


def grouped_sql(metric: str, name: str, where: str, value: str) -> str:
    """One line per ``name``, aggregating the series that share it (ranks of a job)."""
    return (
        f"SELECT $__time(bucket), {name} AS metric, {value} AS value\n"
        f"FROM {series_of(metric)}\n"
        f"WHERE {where}\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1"
    )


def counter_rate_sql(metric: str, name: str, where: str) -> str:
    """Per-second rate of a counter between consecutive time groups (a decrease, a counter
    reset, gives no point rather than a negative rate)."""
    return (
        "SELECT time, metric,\n"
        "       (total - previous) / extract(epoch FROM time - previous_time) AS value\n"
        "FROM (\n"
        "  SELECT time, metric, total,\n"
        "         lag(total) OVER w AS previous, lag(time) OVER w AS previous_time\n"
        "  FROM (\n"
        f"    SELECT $__time(bucket), {name} AS metric, max AS total\n"
        f"    FROM {series_of(metric)}\n"
        f"    WHERE {where}\n"
        "  ) AS grouped\n"
        "  WINDOW w AS (PARTITION BY metric ORDER BY time)\n"
        ") AS paired\n"
        "WHERE total >= previous\n"
        "ORDER BY 1"
    )
