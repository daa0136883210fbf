"""A dashboard as code on Grafana's own typed SDK (``grafana-foundation-sdk``): :class:`Board`
collects panels, variables and annotations as the SDK's builders and renders the JSON Grafana
imports; the variables and panel options the boards share.

Every board reads one data source through the ``datasource`` variable, never a fixed uid, so an
existing Grafana can import it: ``__inputs`` asks for the data source on import, and a
provisioned copy falls back to a data source of the right type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from grafana_foundation_sdk.builders import common, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.cog import builder as cog
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prometheus_model

Json = dict[str, Any]
PanelKind = Literal["timeseries", "table", "stat"]

POSTGRES = "grafana-postgresql-datasource"
PROMETHEUS = "prometheus"
_PLUGIN_NAMES = {POSTGRES: "PostgreSQL", PROMETHEUS: "Prometheus"}
_INPUTS = {POSTGRES: "DS_TUNELOOP", PROMETHEUS: "DS_PROMETHEUS"}
DATASOURCE = "${datasource}"

MAX_DATA_POINTS = 200
"""Points per series a time-series panel asks for: 7 days gives a 1-hour ``$__interval``, so
week-long views group hourly rollups and never touch a raw sample older than the rollups'
watermark; a day gives 5 minutes, six hours 2 minutes."""


def _new_panel(kind: PanelKind) -> Any:
    """An SDK panel builder of ``kind`` with its options set (Grafana expects an object)."""
    if kind == "timeseries":
        legend = (
            common.VizLegendOptions()
            .display_mode(common_model.LegendDisplayMode.LIST)
            .placement(common_model.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        return timeseries.Panel().legend(legend)
    if kind == "table":
        return table.Panel().show_header(True)
    return stat.Panel().reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))


def datasource_ref(plugin: str) -> model.DataSourceRef:
    return model.DataSourceRef(type_val=plugin, uid=DATASOURCE)


# --------------------------------------------------------------------------- SQL queries


class SqlQuery(variants.Dataquery):
    """A raw-SQL target of Grafana's PostgreSQL data source (the SDK models none)."""

    def __init__(self, ref_id: str, sql: str, fmt: str) -> None:
        self.ref_id, self.sql, self.fmt = ref_id, sql, fmt

    def to_json(self) -> Json:
        return {
            "refId": self.ref_id,
            "datasource": datasource_ref(POSTGRES).to_json(),
            "editorMode": "code",
            "format": self.fmt,
            "rawQuery": True,
            "rawSql": self.sql,
        }


class SqlTarget(cog.Builder[variants.Dataquery]):
    def __init__(self, ref_id: str, sql: str, fmt: str) -> None:
        self._query = SqlQuery(ref_id, sql, fmt)

    def build(self) -> variants.Dataquery:
        return self._query


class SqlAnnotationTarget(model.AnnotationTarget):
    """An annotation's SQL query: the SDK's target models only Grafana's built-in one."""

    def __init__(self, sql: str) -> None:
        super().__init__()
        self.sql = sql

    def to_json(self) -> dict[str, object]:
        return {"refId": "Anno", "rawSql": self.sql, "format": "table", "editorMode": "code"}


class _Built(cog.Builder[model.AnnotationTarget]):
    def __init__(self, target: model.AnnotationTarget) -> None:
        self._target = target

    def build(self) -> model.AnnotationTarget:
        return self._target


def annotation(name: str, sql: str, color: str) -> builders.AnnotationQuery:
    return (
        builders.AnnotationQuery()
        .name(name)
        .datasource(datasource_ref(POSTGRES))
        .enable(True)
        .icon_color(color)
        .target(_Built(SqlAnnotationTarget(sql)))
    )


# --------------------------------------------------------------------------- variables


def query_variable(
    name: str, label: str, sql: str, *, multi: bool = False, refresh: int = 1
) -> builders.QueryVariable:
    """A variable of the PostgreSQL boards, its values from ``sql``."""
    variable = (
        builders.QueryVariable(name)
        .label(label)
        .datasource(datasource_ref(POSTGRES))
        .query(sql)
        .refresh(model.VariableRefresh(refresh))
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(multi)
    )
    return variable


def promql_variable(
    name: str, label: str, query: str, *, all_value: str = ".*"
) -> builders.QueryVariable:
    """A multi-value variable of the Prometheus board, all values by default."""
    return (
        builders.QueryVariable(name)
        .label(label)
        .datasource(datasource_ref(PROMETHEUS))
        .query({"query": query, "refId": name})
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(all_value)
        .current(model.VariableOption(text="All", value="$__all"))
    )


PROJECT_VARIABLE = query_variable("project", "Project", "SELECT name FROM projects ORDER BY 1")


# --------------------------------------------------------------------------- the board


@dataclass
class Board:
    uid: str
    title: str
    description: str
    plugin: str = POSTGRES
    variables: list[cog.Builder[model.VariableModel]] = field(default_factory=list)
    annotations: list[cog.Builder[model.AnnotationQuery]] = field(default_factory=list)
    time_from: str = "now-6h"
    panels: list[cog.Builder[model.Panel]] = field(default_factory=list)
    _cursor: tuple[int, int] = (0, 0)
    _row_bottom: int = 0

    def add(
        self,
        kind: PanelKind,
        title: str,
        description: str,
        *sql: str,
        unit: str,
        fmt: str = "time_series",
        width: int = 12,
        height: int = 8,
        stacked: bool = False,
    ) -> None:
        """A panel of SQL queries (targets A, B, ...); ``stacked``: its lines add up (shares
        of a whole)."""
        targets = [SqlTarget(chr(ord("A") + i), text, fmt) for i, text in enumerate(sql)]
        self._place(kind, title, description, targets, unit, width, height, stacked)

    def add_promql(
        self,
        title: str,
        description: str,
        *queries: tuple[str, str],
        unit: str,
        kind: PanelKind = "timeseries",
        width: int = 12,
        height: int = 8,
    ) -> None:
        """A panel of PromQL ``(expression, legend)`` queries; stats and tables are instant."""
        targets = []
        for i, (expr, legend) in enumerate(queries):
            query = (
                prometheus.Dataquery()
                .ref_id(chr(ord("A") + i))
                .datasource(datasource_ref(PROMETHEUS))
                .editor_mode(prometheus_model.QueryEditorMode.CODE)
                .expr(expr)
                .legend_format(legend)
            )
            targets.append(query.range() if kind == "timeseries" else query.instant())
        self._place(kind, title, description, targets, unit, width, height)

    def _place(
        self,
        kind: PanelKind,
        title: str,
        description: str,
        targets: list[Any],
        unit: str,
        width: int,
        height: int,
        stacked: bool = False,
    ) -> None:
        x, y = self._cursor
        if x + width > 24:  # wrap: the SDK's own placement lets a wide panel overflow
            x, y = 0, self._row_bottom
        self._cursor = (x + width, y)
        self._row_bottom = max(self._row_bottom, y + height)
        panel = (
            _new_panel(kind)
            .id(len(self.panels) + 1)
            .title(title)
            .description(description)
            .datasource(datasource_ref(self.plugin))
            .targets(targets)
            .unit(unit)
            .grid_pos(model.GridPos(h=height, w=width, x=x, y=y))
        )
        if kind == "timeseries":
            panel = panel.max_data_points(MAX_DATA_POINTS)
        if stacked:
            normal = common.StackingConfig().mode(common_model.StackingMode.NORMAL)
            panel = panel.stacking(normal).fill_opacity(60)
        self.panels.append(panel)

    def build(self) -> model.Dashboard:
        dashboard = (
            builders.Dashboard(self.title)
            .uid(self.uid)
            .description(self.description)
            .tags(["tuneloop"])
            .readonly()
            .timezone("utc")
            .time(self.time_from, "now")
            .refresh("1m")
            .version(1)
            .with_variable(self._datasource_variable())
        )
        for variable in self.variables:
            dashboard = dashboard.with_variable(variable)
        for item in self.annotations:
            dashboard = dashboard.annotation(item)
        for panel in self.panels:
            dashboard = dashboard.with_panel(panel)
        built = dashboard.build()
        # The SDK gives every variable the same placeholder id; Grafana keys its variable state
        # by id where there is one, so each gets its name, as Grafana itself does.
        declared_list = built.templating.list_val if built.templating else None
        for declared in declared_list or []:
            declared.id_val = declared.name
        return built

    def _datasource_variable(self) -> builders.DatasourceVariable:
        # Import fills in the chosen data source; provisioned, Grafana picks one of the type.
        chosen = f"${{{_INPUTS[self.plugin]}}}"
        return (
            builders.DatasourceVariable("datasource")
            .label("Data source")
            .type(self.plugin)
            .current(model.VariableOption(text=chosen, value=chosen))
        )

    def to_json(self) -> Json:
        """The dashboard as Grafana exports it for sharing: ``__inputs`` names the data
        source to pick on import and ``__requires`` the plugins the panels need."""
        body: Json = json.loads(json.dumps(self.build(), cls=JSONEncoder))
        # The SDK writes no list when a board has no annotations of its own; Grafana adds
        # its built-in one to whatever list there is.
        body["annotations"].setdefault("list", [])
        name = _PLUGIN_NAMES[self.plugin]
        panel_types = sorted({panel["type"] for panel in body["panels"]})
        return {
            "__inputs": [
                {
                    "name": _INPUTS[self.plugin],
                    "label": name,
                    "description": f"The {name} data source this dashboard reads",
                    "type": "datasource",
                    "pluginId": self.plugin,
                    "pluginName": name,
                }
            ],
            "__requires": [
                {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.1.0"},
                {"type": "datasource", "id": self.plugin, "name": name, "version": "1.0.0"},
                *(
                    {"type": "panel", "id": kind, "name": kind, "version": ""}
                    for kind in panel_types
                ),
            ],
            **body,
        }
