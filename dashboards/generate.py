"""Builds the Grafana dashboards in this folder from code: ``python -m dashboards.generate``.

The JSON files are checked in (Grafana provisions them as they are); a test fails when they
differ from what this module builds, so edit here and regenerate.

Every panel reads the store through the PostgreSQL data source. Time series come from
``tuneloop_series`` (see migrations 0005 and 0007), which picks raw samples, ``samples_1m`` or
``samples_1h`` by the panel's interval and range and aggregates each series per time bucket
of the panel's interval, so the panel SQL only selects and names: its time is the bucket itself
(``$__time(bucket)``, a timestamp), not ``$__timeGroupAlias``, which would recompute the same
bucket as a ``numeric`` for every row.
Template variables reach SQL only as ``${var:sqlstring}``: each value is quoted and its quotes
doubled, never pasted as raw text.
"""

# Panel SQL is assembled from this module's own constants; Grafana fills in the variables.
# ruff: noqa: S608

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "grafana-postgresql-datasource", "uid": "tuneloop-postgres"}
PROMETHEUS = {"type": "prometheus", "uid": "${datasource}"}
"""The Prometheus dashboard's data source is a variable: any Prometheus holding dcgm-exporter
and node-exporter series (its own scrapes, or tuneloop's project view)."""
SCHEMA_VERSION = 39

Json = dict[str, Any]


# --------------------------------------------------------------------------- SQL snippets


def series_of(metric: str) -> str:
    return (
        f"tuneloop_series(${{project:sqlstring}}, '{metric}', "
        "$__timeFrom(), $__timeTo(), $__interval_ms)"
    )


GPU_FILTER = "labels->>'hostname' IN (${host:sqlstring}) AND labels->>'gpu' IN (${gpu:sqlstring})"
GPU_NAME = "(labels->>'hostname') || ' gpu ' || (labels->>'gpu')"
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


# --------------------------------------------------------------------------- building blocks


@dataclass
class Board:
    uid: str
    title: str
    description: str
    variables: list[Json] = field(default_factory=list)
    annotations: list[Json] = field(default_factory=list)
    panels: list[Json] = field(default_factory=list)
    time_from: str = "now-6h"

    def add(
        self, panel_type: str, title: str, *sql: str, fmt: str = "time_series", **extra: Any
    ) -> None:
        targets = [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "editorMode": "code",
                "format": fmt,
                "rawQuery": True,
                "rawSql": text,
            }
            for i, text in enumerate(sql)
        ]
        self._place(panel_type, title, DATASOURCE, targets, extra)

    def add_promql(self, title: str, *queries: tuple[str, str], **extra: Any) -> None:
        """A time-series panel of PromQL ``(expression, legend)`` queries."""
        targets = [
            {
                "refId": chr(ord("A") + i),
                "datasource": PROMETHEUS,
                "editorMode": "code",
                "expr": expr,
                "legendFormat": legend,
                "range": True,
            }
            for i, (expr, legend) in enumerate(queries)
        ]
        self._place("timeseries", title, PROMETHEUS, targets, extra)

    def _place(
        self, panel_type: str, title: str, datasource: Json, targets: list[Json], extra: Json
    ) -> None:
        width = extra.pop("width", 12)
        height = extra.pop("height", 8)
        if self.panels:
            last = self.panels[-1]["gridPos"]
            x, y = last["x"] + last["w"], last["y"]
            if x + width > 24:
                x, y = 0, y + last["h"]
        else:
            x, y = 0, 0
        panel: Json = {
            "id": len(self.panels) + 1,
            "type": panel_type,
            "title": title,
            "datasource": datasource,
            "gridPos": {"x": x, "y": y, "w": width, "h": height},
            "targets": targets,
        }
        panel.update(extra)
        self.panels.append(panel)

    def to_json(self) -> Json:
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["tuneloop"],
            "editable": False,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "refresh": "1m",
            "timezone": "utc",
            "time": {"from": self.time_from, "to": "now"},
            "templating": {"list": self.variables},
            "annotations": {"list": [BUILTIN_ANNOTATION, *self.annotations]},
            "panels": self.panels,
        }


BUILTIN_ANNOTATION: Json = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}


def query_variable(
    name: str, label: str, sql: str, *, multi: bool = False, refresh: int = 1
) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": sql,
        "definition": sql,
        "refresh": refresh,
        "multi": multi,
        "includeAll": multi,
        "sort": 1,
        "current": {},
        "hide": 0,
    }


PROJECT_VARIABLE = query_variable("project", "Project", "SELECT name FROM projects ORDER BY 1")


def annotation(name: str, sql: str, color: str) -> Json:
    return {
        "name": name,
        "datasource": DATASOURCE,
        "enable": True,
        "iconColor": color,
        "rawQuery": sql,
        "target": {"refId": "Anno", "rawSql": sql, "format": "table", "editorMode": "code"},
    }


MAX_DATA_POINTS = 200
"""Points per series a time-series panel asks for: 7 days gives a 1-hour ``$__interval``, so
week-long views group hourly rollups and never touch a raw sample older than the rollups'
watermark; a day gives 5 minutes, six hours 2 minutes."""


def timeseries(unit: str) -> Json:
    return {
        "maxDataPoints": MAX_DATA_POINTS,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }


# --------------------------------------------------------------------------- dashboards


def fleet() -> Board:
    gpu_series = (
        "SELECT DISTINCT labels->>'{label}' FROM series AS s JOIN projects AS p "
        "ON p.id = s.project_id WHERE p.name = ${{project:sqlstring}} "
        "AND s.metric = 'DCGM_FI_DEV_GPU_UTIL'{extra} ORDER BY 1"
    )
    host_series = (
        "SELECT DISTINCT labels->>'hostname' FROM series AS s JOIN projects AS p "
        "ON p.id = s.project_id WHERE p.name = ${project:sqlstring} "
        "AND (s.metric = 'DCGM_FI_DEV_GPU_UTIL' OR s.metric LIKE 'node%') ORDER BY 1"
    )
    board = Board(
        "tuneloop-fleet",
        "Fleet",
        "The GPU fleet at a glance: utilization, memory, power, temperature, clocks and "
        "errors per host and GPU (dcgm-exporter names), network and disk I/O per host.",
        variables=[
            PROJECT_VARIABLE,
            query_variable("host", "Host", host_series, multi=True, refresh=2),
            query_variable(
                "gpu",
                "GPU",
                gpu_series.format(
                    label="gpu", extra=" AND labels->>'hostname' IN (${host:sqlstring})"
                ),
                multi=True,
                refresh=2,
            ),
        ],
    )
    board.add(
        "timeseries",
        "GPU utilization",
        gauge_sql("DCGM_FI_DEV_GPU_UTIL", GPU_NAME, GPU_FILTER),
        **timeseries("percent"),
    )
    board.add(
        "timeseries",
        "GPU memory used",
        gauge_sql("DCGM_FI_DEV_FB_USED", GPU_NAME, GPU_FILTER),
        **timeseries("decmbytes"),
    )
    board.add(
        "timeseries",
        "Power draw",
        gauge_sql("DCGM_FI_DEV_POWER_USAGE", GPU_NAME, GPU_FILTER),
        **timeseries("watt"),
    )
    board.add(
        "timeseries",
        "GPU temperature (max)",
        gauge_sql("DCGM_FI_DEV_GPU_TEMP", GPU_NAME, GPU_FILTER, "max"),
        **timeseries("celsius"),
    )
    board.add(
        "timeseries",
        "SM clock (min; a drop under load is throttling)",
        gauge_sql("DCGM_FI_DEV_SM_CLOCK", GPU_NAME, GPU_FILTER, "min"),
        **timeseries("rotmhz"),
    )
    board.add(
        "timeseries",
        "Clock event reasons (bitmask, max)",
        gauge_sql("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", GPU_NAME, GPU_FILTER, "max"),
        **timeseries("none"),
    )
    board.add(
        "timeseries",
        "Last XID error code",
        gauge_sql("DCGM_FI_DEV_XID_ERRORS", GPU_NAME, GPU_FILTER, "max"),
        **timeseries("none"),
    )
    board.add(
        "timeseries",
        "Remapped rows and PCIe replays",
        gauge_sql(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            GPU_NAME + " || ' remapped'",
            GPU_FILTER,
            "max",
        ),
        gauge_sql(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU_NAME + " || ' replays'", GPU_FILTER, "max"
        ),
        **timeseries("none"),
    )
    host_filter = "labels->>'hostname' IN (${host:sqlstring})"
    device = "(labels->>'hostname') || ' ' || (labels->>'device')"
    board.add(
        "timeseries",
        "Network I/O per host and interface",
        counter_rate_sql("node_network_receive_bytes_total", device + " || ' rx'", host_filter),
        counter_rate_sql("node_network_transmit_bytes_total", device + " || ' tx'", host_filter),
        **timeseries("Bps"),
    )
    board.add(
        "timeseries",
        "Disk I/O per host and device",
        counter_rate_sql("node_disk_read_bytes_total", device + " || ' read'", host_filter),
        counter_rate_sql("node_disk_written_bytes_total", device + " || ' written'", host_filter),
        **timeseries("Bps"),
    )
    return board


def fleet_prometheus() -> Board:
    gpu = 'hostname=~"$host", gpu=~"$gpu"'
    legend = "{{hostname}} gpu {{gpu}}"
    board = Board(
        "tuneloop-fleet-prometheus",
        "Fleet (Prometheus)",
        "The Fleet dashboard in PromQL, for a Prometheus that scrapes dcgm-exporter and "
        "node-exporter, or tuneloop's project view (/api/v1/projects/NAME/metrics).",
        variables=[
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
            },
            {
                "name": "host",
                "label": "Host",
                "type": "query",
                "datasource": PROMETHEUS,
                "query": {
                    "query": "label_values(DCGM_FI_DEV_GPU_UTIL, hostname)",
                    "refId": "host",
                },
                "definition": "label_values(DCGM_FI_DEV_GPU_UTIL, hostname)",
                "refresh": 2,
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "sort": 1,
                "current": {},
                "hide": 0,
            },
            {
                "name": "gpu",
                "label": "GPU",
                "type": "query",
                "datasource": PROMETHEUS,
                "query": {
                    "query": 'label_values(DCGM_FI_DEV_GPU_UTIL{hostname=~"$host"}, gpu)',
                    "refId": "gpu",
                },
                "definition": 'label_values(DCGM_FI_DEV_GPU_UTIL{hostname=~"$host"}, gpu)',
                "refresh": 2,
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "sort": 1,
                "current": {},
                "hide": 0,
            },
        ],
    )
    gauges = (
        ("GPU utilization", "DCGM_FI_DEV_GPU_UTIL", "percent"),
        ("GPU memory used", "DCGM_FI_DEV_FB_USED", "decmbytes"),
        ("Power draw", "DCGM_FI_DEV_POWER_USAGE", "watt"),
        ("GPU temperature", "DCGM_FI_DEV_GPU_TEMP", "celsius"),
        ("SM clock (a drop under load is throttling)", "DCGM_FI_DEV_SM_CLOCK", "rotmhz"),
        ("Last XID error code", "DCGM_FI_DEV_XID_ERRORS", "none"),
    )
    for title, metric, unit in gauges:
        board.add_promql(title, (f"{metric}{{{gpu}}}", legend), **timeseries(unit))
    board.add_promql(
        "Energy use (from the energy counter)",
        (
            f"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{gpu}}}[$__rate_interval]) / 1000",
            legend,
        ),
        **timeseries("watt"),
    )
    board.add_promql(
        "Remapped rows and PCIe replays",
        (f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{gpu}}}", legend + " remapped"),
        (f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{gpu}}}", legend + " replays"),
        **timeseries("none"),
    )
    host = 'hostname=~"$host"'
    board.add_promql(
        "Network I/O per host and interface",
        (
            f"rate(node_network_receive_bytes_total{{{host}}}[$__rate_interval])",
            "{{hostname}} {{device}} rx",
        ),
        (
            f"rate(node_network_transmit_bytes_total{{{host}}}[$__rate_interval])",
            "{{hostname}} {{device}} tx",
        ),
        **timeseries("Bps"),
    )
    board.add_promql(
        "Disk I/O per host and device",
        (
            f"rate(node_disk_read_bytes_total{{{host}}}[$__rate_interval])",
            "{{hostname}} {{device}} read",
        ),
        (
            f"rate(node_disk_written_bytes_total{{{host}}}[$__rate_interval])",
            "{{hostname}} {{device}} written",
        ),
        **timeseries("Bps"),
    )
    return board


JOBS_OF_PROJECT = (
    "SELECT j.name FROM jobs AS j JOIN projects AS p ON p.id = j.project_id "
    "WHERE p.name = ${project:sqlstring} "
    "UNION SELECT s.labels->>'job' FROM series AS s JOIN projects AS p ON p.id = s.project_id "
    "WHERE p.name = ${project:sqlstring} AND s.metric = 'tuneloop_step_duration_seconds' "
    "ORDER BY 1"
)
JOB_OF_PROJECT = (
    "FROM jobs AS j JOIN projects AS p ON p.id = j.project_id "
    "WHERE p.name = ${project:sqlstring} AND j.name = ${job:sqlstring}"
)


def job() -> Board:
    board = Board(
        "tuneloop-job",
        "Job",
        "One training job: step time and its phases, throughput, goodput measured by the "
        "tuner, the GPUs it runs on; the tuner's trials and config changes as annotations.",
        variables=[PROJECT_VARIABLE, query_variable("job", "Job", JOBS_OF_PROJECT, refresh=2)],
        annotations=[
            annotation(
                "Trials",
                "SELECT t.started_at AS time, t.completed_at AS timeend,\n"
                "       'trial ' || t.number || ' ' || t.state || ': ' || t.params::text AS text,\n"
                "       st.name AS tags\n"
                "FROM trials AS t JOIN studies AS st ON st.id = t.study_id\n"
                "JOIN jobs AS j ON j.id = st.job_id JOIN projects AS p ON p.id = j.project_id\n"
                "WHERE p.name = ${project:sqlstring} AND j.name = ${job:sqlstring}\n"
                "  AND $__timeFilter(t.started_at)\n"
                "ORDER BY 1",
                "purple",
            ),
            annotation(
                "Config changes",
                "SELECT c.created_at AS time,\n"
                "       c.kind || ' v' || c.version || ' by ' || c.source || ': '"
                " || c.config::text AS text,\n"
                "       c.kind AS tags\n"
                "FROM job_configs AS c JOIN jobs AS j ON j.id = c.job_id\n"
                "JOIN projects AS p ON p.id = j.project_id\n"
                "WHERE p.name = ${project:sqlstring} AND j.name = ${job:sqlstring}\n"
                "  AND $__timeFilter(c.created_at)\n"
                "ORDER BY 1",
                "orange",
            ),
        ],
    )
    board.add(
        "timeseries",
        "Step time per rank",
        gauge_sql("tuneloop_step_duration_seconds", "'rank ' || (labels->>'rank')", JOB_FILTER),
        **timeseries("s"),
    )
    board.add(
        "timeseries",
        "Step phases (mean over ranks)",
        grouped_sql(
            "tuneloop_step_phase_seconds", "labels->>'phase'", JOB_FILTER, "sum(sum) / sum(count)"
        ),
        **timeseries("s"),
    )
    board.add(
        "timeseries",
        "Samples per second (all ranks)",
        grouped_sql("tuneloop_samples_per_second", "'samples/s'", JOB_FILTER, "sum(avg)"),
        **timeseries("none"),
    )
    board.add(
        "timeseries",
        "Goodput measured per trial",
        "SELECT t.completed_at AS time, st.name AS metric, t.value AS value\n"
        "FROM trials AS t JOIN studies AS st ON st.id = t.study_id\n"
        "JOIN jobs AS j ON j.id = st.job_id JOIN projects AS p ON p.id = j.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND j.name = ${job:sqlstring}\n"
        "  AND st.objective = 'goodput' AND t.state = 'complete'\n"
        "  AND $__timeFilter(t.completed_at)\n"
        "ORDER BY 1, 2",
        **timeseries("none"),
    )
    board.add(
        "timeseries",
        "GPU utilization of the job's GPUs",
        gauge_sql("DCGM_FI_DEV_GPU_UTIL", GPU_NAME, JOB_FILTER),
        **timeseries("percent"),
        width=24,
    )
    return board


def tuner() -> Board:
    board = Board(
        "tuneloop-tuner",
        "Tuner",
        "Studies, their trials, the best value found over time, config changes and rollbacks.",
        variables=[PROJECT_VARIABLE],
        time_from="now-7d",
    )
    board.add(
        "table",
        "Studies",
        "SELECT st.name AS study, j.name AS job, st.objective, st.direction, st.strategy,\n"
        "       st.state, count(t.id) AS trials,\n"
        "       CASE WHEN st.direction = 'minimize' THEN min(t.value) ELSE max(t.value) END"
        " AS best\n"
        "FROM studies AS st JOIN jobs AS j ON j.id = st.job_id\n"
        "JOIN projects AS p ON p.id = j.project_id\n"
        "LEFT JOIN trials AS t ON t.study_id = st.id AND t.state = 'complete'\n"
        "WHERE p.name = ${project:sqlstring}\n"
        "GROUP BY st.id, j.name\n"
        "ORDER BY st.created_at DESC, st.name",
        fmt="table",
        width=24,
    )
    board.add(
        "timeseries",
        "Best value so far per study",
        "SELECT t.completed_at AS time, st.name AS metric,\n"
        "       CASE WHEN st.direction = 'minimize'\n"
        "            THEN min(t.value) OVER w ELSE max(t.value) OVER w END AS value\n"
        "FROM trials AS t JOIN studies AS st ON st.id = t.study_id\n"
        "JOIN jobs AS j ON j.id = st.job_id JOIN projects AS p ON p.id = j.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND t.state = 'complete'\n"
        "  AND t.completed_at <= $__timeTo()\n"
        "WINDOW w AS (PARTITION BY st.id ORDER BY t.completed_at, t.number)\n"
        "ORDER BY 1, 2",
        **timeseries("none"),
    )
    board.add(
        "table",
        "Trials",
        "SELECT t.started_at AS time, st.name AS study, t.number, t.state, t.value,\n"
        "       t.params::text AS params\n"
        "FROM trials AS t JOIN studies AS st ON st.id = t.study_id\n"
        "JOIN jobs AS j ON j.id = st.job_id JOIN projects AS p ON p.id = j.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND $__timeFilter(t.started_at)\n"
        "ORDER BY 1 DESC, 2, 3",
        fmt="table",
    )
    board.add(
        "table",
        "Config changes",
        "SELECT c.created_at AS time, j.name AS job, c.kind, c.version, c.source,\n"
        "       c.config::text AS config\n"
        "FROM job_configs AS c JOIN jobs AS j ON j.id = c.job_id\n"
        "JOIN projects AS p ON p.id = j.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND $__timeFilter(c.created_at)\n"
        "ORDER BY 1 DESC, 2",
        fmt="table",
    )
    board.add(
        "table",
        "Rollbacks",
        "SELECT a.created_at AS time, a.actor, a.action, a.target, a.details::text AS details\n"
        "FROM audit_log AS a JOIN projects AS p ON p.id = a.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND a.action LIKE '%rollback%'\n"
        "  AND $__timeFilter(a.created_at)\n"
        "ORDER BY 1 DESC",
        fmt="table",
        width=24,
    )
    return board


RULES_OF_PROJECT = (
    "FROM alert_instances AS i JOIN alert_rules AS r ON r.id = i.rule_id\n"
    "JOIN projects AS p ON p.id = r.project_id\n"
    "WHERE p.name = ${project:sqlstring}"
)


def alerts() -> Board:
    board = Board(
        "tuneloop-alerts",
        "Alerts",
        "What fires now, what fired recently, and whether the notifications got out.",
        variables=[PROJECT_VARIABLE],
        time_from="now-24h",
    )
    board.add(
        "table",
        "Firing now",
        "SELECT i.fired_at AS time, r.name AS rule, r.severity, i.labels::text AS labels,\n"
        "       i.value\n"
        f"{RULES_OF_PROJECT} AND i.state = 'firing'\n"
        "ORDER BY 1 DESC, 2",
        fmt="table",
        width=24,
    )
    board.add(
        "table",
        "Recent alerts",
        "SELECT i.fired_at AS time, r.name AS rule, r.severity, i.state,\n"
        "       i.resolved_at, i.labels::text AS labels\n"
        f"{RULES_OF_PROJECT} AND $__timeFilter(i.fired_at)\n"
        "ORDER BY 1 DESC, 2",
        fmt="table",
        width=24,
    )
    board.add(
        "timeseries",
        "Notifications by outcome",
        "SELECT $__timeGroupAlias(n.created_at, $__interval), n.status AS metric,"
        " count(*) AS value\n"
        "FROM notifications AS n JOIN alert_instances AS i ON i.id = n.instance_id\n"
        "JOIN alert_rules AS r ON r.id = i.rule_id JOIN projects AS p ON p.id = r.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND $__timeFilter(n.created_at)\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1, 2",
        **timeseries("none"),
    )
    board.add(
        "table",
        "Failed or pending notifications",
        "SELECT n.created_at AS time, r.name AS rule, n.receiver, n.event, n.status,\n"
        "       n.attempts, n.last_error\n"
        "FROM notifications AS n JOIN alert_instances AS i ON i.id = n.instance_id\n"
        "JOIN alert_rules AS r ON r.id = i.rule_id JOIN projects AS p ON p.id = r.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND n.status <> 'sent'\n"
        "  AND $__timeFilter(n.created_at)\n"
        "ORDER BY 1 DESC",
        fmt="table",
    )
    return board


USAGE = (
    "tuneloop_gpu_usage(${project:sqlstring}, $__timeFrom(), $__timeTo(),\n"
    "    ${idle_below:sqlstring}::double precision)"
)


def cost_by(column: str, heading: str) -> str:
    return (
        f"SELECT coalesce(nullif({column}, ''), '(none)') AS {heading},\n"
        "       round((sum(gpu_seconds) / 3600)::numeric, 3) AS gpu_hours,\n"
        "       round((sum(idle_gpu_seconds) / 3600)::numeric, 3) AS idle_gpu_hours,\n"
        "       round((sum(energy_joules) / 3600000)::numeric, 3) AS energy_kwh\n"
        f"FROM {USAGE}\n"
        "GROUP BY 1\n"
        "ORDER BY 2 DESC, 1"
    )


def cost() -> Board:
    board = Board(
        "tuneloop-cost",
        "Cost",
        "GPU-hours, idle GPU-hours (average utilization below the threshold in a minute) and "
        "energy from the DCGM energy counters, per team, job and project, over the period.",
        variables=[
            PROJECT_VARIABLE,
            {
                "name": "idle_below",
                "label": "Idle below (%)",
                "type": "custom",
                "query": "1,5,10",
                "current": {"text": "5", "value": "5"},
                "options": [
                    {"text": v, "value": v, "selected": v == "5"} for v in ("1", "5", "10")
                ],
                "multi": False,
                "includeAll": False,
                "hide": 0,
            },
        ],
        time_from="now-30d",
    )
    board.add(
        "stat",
        "Project total",
        "SELECT round((sum(gpu_seconds) / 3600)::numeric, 3) AS gpu_hours,\n"
        "       round((sum(idle_gpu_seconds) / 3600)::numeric, 3) AS idle_gpu_hours,\n"
        "       round((sum(energy_joules) / 3600000)::numeric, 3) AS energy_kwh\n"
        f"FROM {USAGE}",
        fmt="table",
        width=24,
        height=5,
    )
    board.add("table", "Per team", cost_by("team", "team"), fmt="table")
    board.add("table", "Per job", cost_by("job", "job"), fmt="table")
    return board


BOARDS = {
    "fleet": fleet,
    "fleet-prometheus": fleet_prometheus,
    "job": job,
    "tuner": tuner,
    "alerts": alerts,
    "cost": cost,
}


def render(name: str) -> str:
    return json.dumps(BOARDS[name]().to_json(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    for name in BOARDS:
        (HERE / f"{name}.json").write_text(render(name))


if __name__ == "__main__":
    main()
