"""The Cost dashboard: GPU-hours, idle GPU-hours and energy per project, team, job, namespace
and pod, MIG instances counted as the API counts them (``tuneloop.cost``, migration 0011), and
their cost in money by the price table (``tuneloop.priced_cost``, migration 0012)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.models import dashboard as model

from dashboards.board import PROJECT_VARIABLE, Board

USAGE = (
    "tuneloop_gpu_usage(${project:sqlstring}, $__timeFrom(), $__timeTo(),\n"
    "    ${idle_below:sqlstring}::double precision)"
)


COST = (
    "tuneloop_gpu_cost(${project:sqlstring}, $__timeFrom(), $__timeTo(),\n"
    "    ${idle_below:sqlstring}::double precision)"
)

# As the API: a group's cost is unknown (null) when a GPU of it has no price, or when prices in
# two currencies apply; never the sum of the priced GPUs alone.
MONEY = (
    "string_agg(DISTINCT currency, ',') AS currency,\n"
    "       CASE WHEN bool_or(cost IS NULL) OR count(DISTINCT currency) > 1 THEN NULL\n"
    "            ELSE round(sum(cost), 2) END AS cost,\n"
    "       CASE WHEN bool_or(cost IS NULL) OR count(DISTINCT currency) > 1 THEN NULL\n"
    "            ELSE round(sum(idle_cost), 2) END AS idle_cost,\n"
    "       count(*) FILTER (WHERE cost IS NULL) AS unpriced_gpus\n"
    f"FROM {COST}"
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


# A value Grafana takes from the URL reaches the SQL as a quoted literal, never as a column.
BY_VARIABLE = (
    "CASE ${group_by:sqlstring} WHEN 'namespace' THEN namespace WHEN 'pod' THEN pod "
    "WHEN 'team' THEN team ELSE job END"
)


def cost() -> Board:
    board = Board(
        "tuneloop-cost",
        "Cost",
        "GPU-hours, idle GPU-hours (average utilization below the threshold in a minute) and "
        "energy from the DCGM energy counters, per team, job, namespace, pod and project, over "
        "the period; a MIG instance counts as a GPU, with an equal share of its GPU's energy.",
        variables=[
            PROJECT_VARIABLE,
            builders.CustomVariable("idle_below")
            .label("Idle below (%)")
            .values("1,5,10")
            .current(model.VariableOption(text="5", value="5")),
            builders.CustomVariable("group_by")
            .label("Group by")
            .values("namespace,pod,team,job")
            .current(model.VariableOption(text="namespace", value="namespace")),
        ],
        time_from="now-30d",
    )
    board.add(
        "stat",
        "Project total",
        "GPU-hours, idle GPU-hours and energy (kWh) of every GPU of the project over the "
        "dashboard's time range.",
        "SELECT round((sum(gpu_seconds) / 3600)::numeric, 3) AS gpu_hours,\n"
        "       round((sum(idle_gpu_seconds) / 3600)::numeric, 3) AS idle_gpu_hours,\n"
        "       round((sum(energy_joules) / 3600000)::numeric, 3) AS energy_kwh\n"
        f"FROM {USAGE}",
        unit="none",
        fmt="table",
        width=24,
        height=5,
    )
    board.add(
        "table",
        "Per team",
        "The same figures per team: the GPU series' team label, else its job's team.",
        cost_by("team", "team"),
        unit="none",
        fmt="table",
    )
    board.add(
        "table",
        "Per job",
        "The same figures per job: the GPU series' job label.",
        cost_by("job", "job"),
        unit="none",
        fmt="table",
    )
    board.add(
        "table",
        "Per ${group_by}",
        "The same figures per the chosen label: a Kubernetes namespace or pod "
        "(dcgm-exporter's pod attribution), a team or a job.",
        cost_by(BY_VARIABLE, "name"),
        unit="none",
        fmt="table",
    )
    board.add(
        "stat",
        "Cost",
        "GPU-hours times the price of a GPU-hour of each GPU's model and capacity type (its "
        "capacity_type label, else on_demand): the project's own prices before the server-wide "
        "ones; a MIG instance is priced as its share of the GPU. Empty when a GPU has no price: "
        "see the unpriced GPUs.",
        f"SELECT {MONEY}",
        unit="none",
        fmt="table",
        width=24,
        height=5,
    )
    board.add(
        "table",
        "Cost per ${group_by}",
        "The cost and the idle cost (idle GPU-hours times their price) per the chosen label.",
        f"SELECT coalesce(nullif({BY_VARIABLE}, ''), '(none)') AS name,\n"
        f"       {MONEY}\n"
        "GROUP BY 1\n"
        "ORDER BY 3 DESC NULLS FIRST, 1",
        unit="none",
        fmt="table",
    )
    return board
