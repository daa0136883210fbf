"""The Cost dashboard on the store the scrape source filled from the real dcgm-exporter captures
(tests/dashboards/conftest.py) shows the figures the API computes (``tuneloop.cost``): per GPU
and MIG instance, per team, job, namespace and pod, and for the project. The board's SQL
function exists on PostgreSQL only (migrations 0005 and 0011)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from dashboards.grafana_sql import Variable
from tests.alerts.conftest import at
from tests.dashboards.conftest import CAPTURES_END_S, CAPTURES_PROJECT
from tests.dashboards.test_panels import panel, run
from tuneloop import cost
from tuneloop.storage.models import Project

pytestmark = pytest.mark.postgres

START, END = at(0), at(CAPTURES_END_S)
CHOSEN = {"project": Variable(CAPTURES_PROJECT), "idle_below": Variable("5")}
Figures = tuple[float, float, float]


def api_usage(engine: Engine) -> list[cost.GpuUsage]:
    with engine.connect() as connection:
        project_id = connection.scalar(select(Project.id).where(Project.name == CAPTURES_PROJECT))
    assert project_id is not None
    return cost.gpu_usage(engine, project_id, START, END)


def table(engine: Engine, title: str, **chosen: Variable) -> dict[str, Figures]:
    sql = panel("cost", title)["targets"][0]["rawSql"]
    _, rows = run(engine, sql, start=START, end=END, **{**CHOSEN, **chosen})
    return {str(row[0]): (float(row[1]), float(row[2]), float(row[3])) for row in rows}


def rounded(group: cost.CostGroup) -> Figures:
    return (round(group.gpu_hours, 3), round(group.idle_gpu_hours, 3), round(group.energy_kwh, 3))


def api_table(usages: list[cost.GpuUsage], by: cost.GroupBy) -> dict[str, Figures]:
    return {group.key or "(none)": rounded(group) for group in cost.summarize(usages, by)}


def test_the_sql_function_gives_every_gpu_and_mig_instance_the_apis_figures(
    captures_store: Engine,
) -> None:
    with captures_store.connect() as connection:
        rows = connection.execute(
            text("SELECT * FROM tuneloop_gpu_usage(:project, :start, :end, 5.0)"),
            {"project": CAPTURES_PROJECT, "start": START, "end": END},
        ).mappings()
        board = {
            cost.gpu_key(row["labels"]): (
                row["namespace"] or None,
                row["pod"] or None,
                row["job"] or None,
                row["team"] or None,
                row["gpu_seconds"],
                row["idle_gpu_seconds"],
                row["energy_joules"],
            )
            for row in rows
        }
    api = {
        cost.gpu_key(u.labels): (
            u.labels.get("namespace"),
            u.labels.get("pod"),
            u.job,
            u.team,
            u.gpu_seconds,
            u.idle_gpu_seconds,
            u.energy_joules,
        )
        for u in api_usage(captures_store)
    }
    assert board == api
    mig = [key for key in board if key.count("/") == 4]
    assert len(mig) == 4, "the MIG instances that report their activity are counted"
    assert all(board[key][4] == CAPTURES_END_S for key in mig)


@pytest.mark.parametrize(
    ("title", "chosen", "by"),
    [
        ("Per team", {}, cost.GroupBy.TEAM),
        ("Per job", {}, cost.GroupBy.JOB),
        ("Per ${group_by}", {"group_by": Variable("namespace")}, cost.GroupBy.NAMESPACE),
        ("Per ${group_by}", {"group_by": Variable("pod")}, cost.GroupBy.POD),
        ("Per ${group_by}", {"group_by": Variable("team")}, cost.GroupBy.TEAM),
    ],
)
def test_the_board_tables_equal_the_apis(
    captures_store: Engine, title: str, chosen: dict[str, Any], by: cost.GroupBy
) -> None:
    found = table(captures_store, title, **chosen)
    want = api_table(api_usage(captures_store), by)
    assert set(found) == set(want)
    for key, figures in want.items():
        assert found[key] == pytest.approx(figures, abs=0.0011), key
    if by is cost.GroupBy.NAMESPACE:
        assert set(found) == {"ml-training", "inference", "default", "(none)"}
    if by is cost.GroupBy.POD:
        assert {"embed-7d9f8c6b5-kq2xw", "cuda-75454ffb9f-8ljq7", "train-llama-0"} <= set(found)


def test_the_project_total_equals_the_apis(captures_store: Engine) -> None:
    sql = panel("cost", "Project total")["targets"][0]["rawSql"]
    _, rows = run(captures_store, sql, start=START, end=END, **CHOSEN)
    found = tuple(float(value) for value in rows[0])
    assert found == pytest.approx(rounded(cost.total(api_usage(captures_store))), abs=0.0011)
    assert found[0] > 0
