"""A dashboard as code: :class:`Board` places panels on the grid and renders Grafana's JSON;
the variables, annotations and panel options the boards share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE = {"type": "grafana-postgresql-datasource", "uid": "tuneloop-postgres"}
PROMETHEUS = {"type": "prometheus", "uid": "${datasource}"}
"""The Prometheus dashboard's data source is a variable: any Prometheus holding dcgm-exporter
and node-exporter series (its own scrapes, or tuneloop's project view)."""
SCHEMA_VERSION = 39

Json = dict[str, Any]


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


def promql_variable(name: str, label: str, query: str) -> Json:
    """A multi-value variable of the Prometheus dashboard, all values by default."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": PROMETHEUS,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
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
