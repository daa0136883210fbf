"""Migration 0012 adds the price table and, on PostgreSQL, the Cost dashboard's
``tuneloop_gpu_cost``, which prices each GPU as the API does (``tuneloop.priced_cost``): the
priced fleet of ``tests/api/price_fleet.py`` written at revision 0011, then priced; the
board's money panels equal the API's figures, with a GPU unpriced and with all priced. On
SQLite, which has no stored functions, the table alone; the downgrade removes both."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text
from sqlalchemy.orm import Session

from dashboards.grafana_sql import Variable
from tests.api import price_fleet as fleet
from tests.dashboards.test_panels import panel, run
from tests.storage.test_writer import make_project
from tuneloop import cost, priced_cost, prices
from tuneloop.storage import make_engine, migrate
from tuneloop.storage.models import HostCapacity

BOTH = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]
CHOSEN = {"project": Variable("p"), "idle_below": Variable("5"), "group_by": Variable("team")}
PLACES = Decimal("0.000001")


@pytest.fixture
def at_0011(empty_database_url: str) -> Iterator[tuple[str, Engine, int]]:
    migrate.upgrade(empty_database_url, "0011")
    engine = make_engine(empty_database_url)
    project = make_project(engine)
    fleet.fill(engine, project)
    yield empty_database_url, engine, project
    engine.dispose()


def add(engine: Engine, project: int | None, rows: list[dict[str, Any]]) -> None:
    with Session(engine) as session:
        for row in rows:
            since = row.get("valid_from")
            prices.add_price(
                session,
                prices.Price(
                    project_id=project,
                    model=row["model"],
                    capacity_type=row.get("capacity_type", "on_demand"),
                    price_per_gpu_hour=Decimal(row["price_per_gpu_hour"]),
                    currency=row["currency"],
                    valid_from=since,
                ),
            )
        session.commit()


def cents(value: Decimal | None) -> Decimal | None:
    return None if value is None else value.quantize(Decimal("0.01"), ROUND_HALF_UP)


def api_money(engine: Engine, project: int) -> priced_cost.PricedReport:
    return priced_cost.priced_usage(engine, project, fleet.T0, fleet.END)


def function_rows(engine: Engine) -> dict[str, tuple[Decimal | None, Decimal | None]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT * FROM tuneloop_gpu_cost('p', :start, :end, 5.0)"),
            {"start": fleet.T0, "end": fleet.END},
        ).mappings()
        return {
            cost.gpu_key(row["labels"]): tuple(  # type: ignore[misc]
                None if row[name] is None else row[name].quantize(PLACES)
                for name in ("cost", "idle_cost")
            )
            for row in rows
        }


def board_equals_api(engine: Engine, project: int) -> priced_cost.PricedReport:
    report = api_money(engine, project)
    api_gpus = {
        cost.gpu_key(item.usage.labels): tuple(
            None if value is None else value.quantize(PLACES)
            for value in (item.cost, item.idle_cost)
        )
        for item in report.usages
    }
    assert function_rows(engine) == api_gpus

    _, (total,) = run(
        engine, panel("cost", "Cost")["targets"][0]["rawSql"], start=fleet.T0, end=fleet.END,
        **CHOSEN,
    )  # fmt: skip
    money = report.total()
    assert total == (
        report.currency,
        cents(money.cost),
        cents(money.idle_cost),
        money.unpriced_gpus,
    )

    sql = panel("cost", "Cost per ${group_by}")["targets"][0]["rawSql"]
    _, rows = run(engine, sql, start=fleet.T0, end=fleet.END, **CHOSEN)
    api_groups = {
        key or "(none)": (cents(group.cost), cents(group.idle_cost), group.unpriced_gpus)
        for key, group in report.money(cost.GroupBy.TEAM).items()
    }
    assert {row[0]: row[2:] for row in rows} == api_groups
    return report


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_upgrade_prices_the_board_as_the_api(at_0011: tuple[str, Engine, int]) -> None:
    url, engine, project = at_0011
    assert "gpu_prices" not in inspect(engine).get_table_names()

    migrate.upgrade(url, "0012")

    add(engine, None, fleet.GLOBAL_PRICES)
    spot_later = {"model": "NVIDIA H100*", "capacity_type": "spot", "price_per_gpu_hour": "3.00",
                  "currency": "USD", "valid_from": fleet.T0 + timedelta(minutes=30)}  # fmt: skip
    add(engine, project, [{"model": fleet.H100, "price_per_gpu_hour": "5", "currency": "USD"}])
    add(engine, project, [spot_later])
    postgres = engine.dialect.name == "postgresql"
    report = board_equals_api(engine, project) if postgres else api_money(engine, project)
    assert report.total().cost is None and [u.labels["modelName"] for u in report.unpriced] == [
        "NVIDIA L4"
    ]
    assert report.money(cost.GroupBy.TEAM)["nlp"].cost == Decimal("8.0")  # 5.00 + 2 x 1.50

    add(engine, project, [{"model": "*", "price_per_gpu_hour": "1", "currency": "USD"}])
    report = board_equals_api(engine, project) if postgres else api_money(engine, project)
    assert (report.total().cost, report.total().idle_cost) == (Decimal("9.25"), Decimal("2.75"))

    # node-1 is spot capacity: its GPUs without a capacity_type label (the on-demand H100 and
    # the L4) are priced as spot; the MIG instances say on-demand themselves.
    with Session(engine) as session:
        session.add(HostCapacity(project_id=project, host="node-1", capacity_type="spot"))
        session.commit()
    report = board_equals_api(engine, project) if postgres else api_money(engine, project)
    by_gpu = {cost.gpu_key(item.usage.labels): item.cost for item in report.usages}
    assert by_gpu["node-1/0/GPU-od"] == Decimal("2.25")  # 30 min at 1.50, 30 at 3.00
    assert by_gpu["node-1/2/GPU-l4"] is None, "no spot price for the L4"
    assert [report.capacity_of(usage) for usage in report.unpriced] == ["spot"]

    # Two rows alike but for their price: the one added last prices the L4.
    l4_spot = {"model": "NVIDIA L4", "capacity_type": "spot", "currency": "USD"}
    add(engine, project, [{**l4_spot, "price_per_gpu_hour": "2"}])
    add(engine, project, [{**l4_spot, "price_per_gpu_hour": "3"}])
    report = board_equals_api(engine, project) if postgres else api_money(engine, project)
    by_gpu = {cost.gpu_key(item.usage.labels): item.cost for item in report.usages}
    assert by_gpu["node-1/2/GPU-l4"] == Decimal("3")


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_downgrade_removes_the_table_and_the_function(at_0011: tuple[str, Engine, int]) -> None:
    url, engine, _ = at_0011
    migrate.upgrade(url)
    add(engine, None, fleet.GLOBAL_PRICES)

    migrate.downgrade(url, "0011")

    assert migrate.current(url) == "0011"
    assert "gpu_prices" not in inspect(engine).get_table_names()
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            found = connection.scalar(
                text("SELECT count(*) FROM pg_proc WHERE proname = 'tuneloop_gpu_cost'")
            )
        assert found == 0
    migrate.upgrade(url)
    assert "gpu_prices" in inspect(engine).get_table_names()
