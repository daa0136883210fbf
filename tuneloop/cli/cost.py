"""``tuneloop cost PROJECT --start ...``: a project's GPU-hours, idle GPU-hours, energy and
their cost in money, per team, job, namespace, pod or GPU, straight from the store (the
figures of ``GET /api/v1/projects/{project}/cost``)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

import typer

from tuneloop import cost, priced_cost, prices
from tuneloop.cli import app
from tuneloop.cli.common import db_session, fail, project_or_fail
from tuneloop.cli.tokens import _table
from tuneloop.settings import get_settings
from tuneloop.storage.timeseries.times import parse_time
from tuneloop.storage.types import utcnow

UNKNOWN = "?"
"""A cost no price gives: unknown, never 0."""


def _money(value: Decimal | None) -> str:
    return UNKNOWN if value is None else f"{value:.2f}"


def _row(name: str, group: cost.CostGroup, money: priced_cost.Money) -> list[str]:
    return [
        name,
        str(group.gpus),
        f"{group.gpu_hours:.3f}",
        f"{group.idle_gpu_hours:.3f}",
        f"{group.energy_kwh:.3f}",
        _money(money.cost),
        _money(money.idle_cost),
    ]


def _time(text: str, name: str) -> datetime:
    try:
        return parse_time(text)
    except ValueError as exc:
        fail(f"--{name}: {exc}")


@app.command("cost")
def cost_command(
    project: Annotated[str, typer.Argument(help="Project name")],
    start: Annotated[str, typer.Option(help="RFC 3339 time or Unix seconds")],
    end: Annotated[
        str | None, typer.Option(help="RFC 3339 time or Unix seconds [default: now]")
    ] = None,
    by: Annotated[cost.GroupBy, typer.Option(help="Group the GPUs by")] = cost.GroupBy.TEAM,
    idle_below: Annotated[
        float, typer.Option(min=0, max=100, help="A minute is idle below this utilization, %")
    ] = cost.DEFAULT_IDLE_BELOW,
) -> None:
    """GPU-hours, idle GPU-hours, kWh, cost and idle cost over a period ('?': a GPU of the group
    has no price; see docs/dashboards.md, Prices)."""
    if get_settings().tsdb_url:
        fail(
            "cost reads the built-in store's samples and rollups; "
            "not available with TUNELOOP_TSDB_URL"
        )
    begin = _time(start, "start")
    finish = _time(end, "end") if end is not None else utcnow()
    if finish <= begin:
        fail("--end must be after --start")
    with db_session() as session:
        found = project_or_fail(session, project)
        report = priced_cost.priced_usage(
            session.connection(), found.id, begin, finish, idle_below=idle_below
        )
    usages = list(priced_cost.usages_of(report))
    money = report.money(by)
    currency = report.currency or "-"
    header = [by.value, "gpus", "gpu_hours", "idle_gpu_hours", "energy_kwh",
              f"cost_{currency}", f"idle_cost_{currency}"]  # fmt: skip
    rows = [_row(g.key or "(none)", g, money[g.key]) for g in cost.summarize(usages, by)]
    _table(header, [*rows, _row("(total)", cost.total(usages), report.total())])
    for usage in report.unpriced:
        model = usage.labels.get(prices.MODEL_LABEL, "no modelName")
        capacity = report.capacity_of(usage)
        typer.echo(f"no price: {cost.gpu_key(usage.labels)} ({model}, {capacity})", err=True)
