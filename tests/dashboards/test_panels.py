"""Every query of every dashboard, expanded as Grafana expands it, runs on a real PostgreSQL
holding a known fleet (``known_data``) and returns the expected columns and values."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import DBAPIError

from dashboards.grafana_sql import GrafanaQuery, Variable
from tests.conftest import reset_postgres
from tests.dashboards import known_data as kd
from tuneloop.storage import make_engine, migrate

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
ALL_BOARDS = {
    path.stem: json.loads(path.read_text()) for path in (ROOT / "dashboards").glob("*.json")
}
BOARDS = {name: board for name, board in ALL_BOARDS.items() if name != "fleet-prometheus"}
"""The dashboards on the PostgreSQL data source (the Prometheus one is run in
tests/api/test_exposition.py against a real Prometheus)."""
HOSTS = ["gpu-node-1", "gpu-node-2", kd.HOSTILE]
VARIABLES = {
    "project": Variable(kd.PROJECT),
    "host": Variable(HOSTS, multi=True, include_all=True),
    "gpu": Variable(["0", "1"], multi=True, include_all=True),
    "job": Variable("llama"),
    "idle_below": Variable("5"),
    "group_by": Variable("job"),
}
Row = tuple[Any, ...]


@pytest.fixture(scope="module")
def store(postgres_server_url: str) -> Iterator[Engine]:
    """The store as ``tuneloop db upgrade`` builds it (with migration 0005's functions),
    holding the known fleet."""
    reset_postgres(postgres_server_url)
    migrate.upgrade(postgres_server_url)
    engine = make_engine(postgres_server_url)
    kd.fill(engine)
    yield engine
    engine.dispose()


def targets() -> Iterator[Any]:
    for board, dashboard in sorted(BOARDS.items()):
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                yield pytest.param(panel, target, id=f"{board}:{panel['title']}:{target['refId']}")


def panel(board: str, title: str) -> dict[str, Any]:
    (found,) = [p for p in BOARDS[board]["panels"] if p["title"] == title]
    return found


def run(
    engine: Engine,
    sql: str,
    *,
    start: datetime = kd.T0,
    end: datetime = kd.END,
    interval_ms: int | None = 3_600_000,
    **variables: Variable,
) -> tuple[list[str], list[Row]]:
    query = GrafanaQuery(start, end, {**VARIABLES, **variables}, interval_ms=interval_ms)
    with engine.connect() as connection:
        result = connection.execute(text(query.expand(sql).replace(":", r"\:")))
        return list(result.keys()), [tuple(row) for row in result]


def series(rows: list[Row]) -> dict[str, list[tuple[float, float]]]:
    """Long time-series rows (time, metric, value) per metric, times in epoch seconds."""
    grouped: dict[str, list[tuple[float, float]]] = {}
    for time, metric, value in rows:
        grouped.setdefault(metric, []).append((seconds(time), float(value)))
    return grouped


def seconds(time: datetime | float) -> float:
    """A time column as Grafana reads it: a timestamp, or a number of epoch seconds."""
    return time.timestamp() if isinstance(time, datetime) else float(time)


def epoch(moment: datetime) -> float:
    return moment.timestamp()


HOURS = [epoch(kd.T0 + timedelta(hours=k)) for k in range(3)]


# --------------------------------------------------------------------------- every query


@pytest.mark.parametrize(("panel_json", "target"), list(targets()))
def test_every_panel_query_runs_with_grafanas_expansion(
    store: Engine, panel_json: dict[str, Any], target: dict[str, Any]
) -> None:
    columns, rows = run(store, target["rawSql"])
    if target["format"] == "time_series":
        assert columns[0] == "time", columns
        times = [row[0] for row in rows]
        assert times == sorted(times), "Grafana needs time series sorted by time"
        assert "metric" in columns or len(columns) >= 2
    assert rows, f"{panel_json['title']} shows nothing on the known fleet"


def test_variable_and_annotation_queries_run(store: Engine) -> None:
    for dashboard in BOARDS.values():
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                _, rows = run(store, variable["query"])
                assert rows, variable["name"]
        for annotation in dashboard["annotations"]["list"]:
            if "target" in annotation:
                columns, rows = run(store, annotation["target"]["rawSql"])
                assert columns[:3] == ["time", "timeend", "text"] or columns[:2] == [
                    "time",
                    "text",
                ]
                assert rows, annotation["name"]


def test_variables_list_the_known_fleet(store: Engine) -> None:
    variables = {v["name"]: v for v in BOARDS["fleet"]["templating"]["list"]}
    assert [r[0] for r in run(store, variables["project"]["query"])[1]] == [
        kd.PROJECT,
        kd.OTHER_PROJECT,
    ]
    assert sorted(r[0] for r in run(store, variables["host"]["query"])[1]) == sorted(HOSTS)
    gpus = run(store, variables["gpu"]["query"], host=Variable([kd.HOSTILE], multi=True))[1]
    assert [r[0] for r in gpus] == ["0"]
    jobs = {v["name"]: v for v in BOARDS["job"]["templating"]["list"]}["job"]
    assert [r[0] for r in run(store, jobs["query"])[1]] == ["llama"]


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("interval_ms", "points"),
    [
        pytest.param(3_600_000, 3, id="1h-from-1h-1m-and-raw"),
        pytest.param(60_000, 180, id="1m-from-1m-and-raw"),
        pytest.param(30_000, 360, id="30s-from-raw"),
    ],
)
def test_gpu_utilization_is_the_same_from_every_source(
    store: Engine, interval_ms: int, points: int
) -> None:
    sql = panel("fleet", "GPU utilization")["targets"][0]["rawSql"]
    columns, rows = run(store, sql, interval_ms=interval_ms)
    assert columns == ["time", "metric", "value"]
    found = series(rows)
    assert sorted(found) == sorted(gpu.name for gpu in kd.GPUS if gpu.gpu in ("0", "1"))
    for gpu in kd.GPUS:
        values = found[gpu.name]
        assert len(values) == points
        for time, value in values:
            hour = int((time - HOURS[0]) // 3600)
            if interval_ms >= 60_000:
                expected = 0.0 if gpu.idle_last_hour and hour == 2 else gpu.base + hour
            else:
                index = int((time - HOURS[0]) // 30)
                expected = gpu.util(kd.T0 + timedelta(seconds=30 * index), index)
            assert value == pytest.approx(expected), (gpu.name, time)


def test_buckets_coarser_than_an_hour_merge_hourly_rollups_with_finer_rows(store: Engine) -> None:
    # 2 h buckets: the first merges hour 0 (samples_1h) with hour 1 (samples_1m), the second
    # is hour 2 (raw samples); each hour holds the same number of samples.
    sql = panel("fleet", "GPU utilization")["targets"][0]["rawSql"]
    found = series(run(store, sql, interval_ms=7_200_000)[1])
    for gpu in kd.GPUS:
        last_hour = 0.0 if gpu.idle_last_hour else gpu.base + 2
        expected = [(HOURS[0], pytest.approx(gpu.base + 0.5)), (HOURS[2], pytest.approx(last_hour))]
        assert found[gpu.name] == expected, gpu.name


def test_seven_days_read_the_hourly_rollups(store: Engine) -> None:
    gpu_panel = panel("fleet", "GPU utilization")
    week = GrafanaQuery(
        kd.END - timedelta(days=7), kd.END, VARIABLES, max_data_points=gpu_panel["maxDataPoints"]
    )
    assert week.interval == 3_600_000
    _, rows = run(
        store, gpu_panel["targets"][0]["rawSql"], start=week.start, interval_ms=week.interval
    )
    # Hour 0 from samples_1h, hour 1 from samples_1m, hour 2 from raw samples.
    assert series(rows)["gpu-node-1 gpu 0"] == [(HOURS[k], 10.0 + k) for k in range(3)]


def test_filters_select_hosts_and_gpus(store: Engine) -> None:
    sql = panel("fleet", "Power draw")["targets"][0]["rawSql"]
    _, rows = run(
        store,
        sql,
        host=Variable(["gpu-node-2"], multi=True),
        gpu=Variable(["1"], multi=True),
    )
    assert series(rows) == {"gpu-node-2 gpu 1": [(h, 300.0) for h in HOURS]}


def test_units_sm_clock_in_hertz_and_replays_as_a_rate(store: Engine) -> None:
    clock = panel("fleet", "SM clock (min; a drop under load is throttling)")
    assert clock["fieldConfig"]["defaults"]["unit"] == "hertz"
    found = series(run(store, clock["targets"][0]["rawSql"])[1])
    assert found["gpu-node-1 gpu 0"] == [(h, pytest.approx(1980.0e6)) for h in HOURS]
    errors = panel("fleet", "Remapped rows and PCIe replays")["targets"]
    replays = series(run(store, errors[1]["rawSql"], interval_ms=60_000)[1])
    # A counter that never moved: a rate of 0 between consecutive buckets, not its total.
    assert replays["gpu-node-1 gpu 0 replays"] and all(
        v == 0.0 for _, v in replays["gpu-node-1 gpu 0 replays"]
    )


def test_panels_show_nothing_for_a_host_without_data(store: Engine) -> None:
    sql = panel("fleet", "GPU temperature (max)")["targets"][0]["rawSql"]
    assert run(store, sql, host=Variable(["gpu-node-9"], multi=True))[1] == []


def test_network_rate_from_counters(store: Engine) -> None:
    sql = panel("fleet", "Network I/O per host and interface")["targets"][0]["rawSql"]
    for interval_ms in (3_600_000, 60_000):
        rows = series(run(store, sql, interval_ms=interval_ms)[1])
        values = rows["gpu-node-1 eth0 rx"]
        assert values and all(v == pytest.approx(kd.NETWORK_BYTES_PER_S) for _, v in values)


def test_job_panels(store: Engine) -> None:
    step = series(run(store, panel("job", "Step time per rank")["targets"][0]["rawSql"])[1])
    assert step == {
        f"rank {r}": [(h, pytest.approx(s)) for h in HOURS] for r, (s, _) in kd.RANKS.items()
    }
    phases = series(
        run(store, panel("job", "Step phases (mean over ranks)")["targets"][0]["rawSql"])[1]
    )
    assert phases == {
        phase: [(h, pytest.approx(v)) for h in HOURS] for phase, v in kd.PHASES.items()
    }
    shares = panel("job", "Step time by phase (diagnosis)")
    assert shares["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert series(run(store, shares["targets"][0]["rawSql"])[1]) == {
        phase: [(h, pytest.approx(v)) for h in HOURS] for phase, v in kd.SHARES.items()
    }
    mfu = panel("job", "MFU (diagnosis)")["targets"][0]["rawSql"]
    assert series(run(store, mfu)[1]) == {"MFU": [(h, pytest.approx(kd.MFU)) for h in HOURS]}
    throughput = panel("job", "Samples per second (all ranks)")["targets"][0]["rawSql"]
    assert series(run(store, throughput)[1]) == {
        "samples/s": [(h, pytest.approx(220.0)) for h in HOURS]
    }
    goodput = panel("job", "Goodput measured per trial")["targets"][0]["rawSql"]
    _, rows = run(store, goodput)
    assert [(time, value) for time, _, value in rows] == [
        (kd.at(10), 5.0),
        (kd.at(20), 3.0),
        (kd.at(30), 8.0),
    ]
    gpus = panel("job", "GPU utilization of the job's GPUs")["targets"][0]["rawSql"]
    assert sorted(series(run(store, gpus)[1])) == ["gpu-node-1 gpu 0", "gpu-node-1 gpu 1"]
    assert run(store, gpus, job=Variable("bert"))[1][0][1] == "gpu-node-2 gpu 0"


def test_job_annotations(store: Engine) -> None:
    trials, configs = BOARDS["job"]["annotations"]["list"]
    _, rows = run(store, trials["target"]["rawSql"])
    assert [(row[0], row[1]) for row in rows] == [
        (kd.at(2), kd.at(10)),
        (kd.at(12), kd.at(20)),
        (kd.at(22), kd.at(30)),
    ]
    assert rows[0][2] == 'trial 0 complete: {"batch_size": 32}'
    _, rows = run(store, configs["target"]["rawSql"])
    assert rows == [(kd.at(15), 'desired v1 by tuner: {"batch_size": 96}', "desired")]


def test_tuner_panels(store: Engine) -> None:
    columns, rows = run(store, panel("tuner", "Studies")["targets"][0]["rawSql"])
    assert dict(zip(columns, rows[0], strict=True)) | {} == {
        "study": "bs-search",
        "job": "llama",
        "objective": "goodput",
        "direction": "maximize",
        "strategy": "bayesian",
        "state": "running",
        "trials": 3,
        "best": 8.0,
    }
    best = panel("tuner", "Best value so far per study")["targets"][0]["rawSql"]
    assert [row[2] for row in run(store, best)[1]] == [5.0, 5.0, 8.0]
    _, rows = run(store, panel("tuner", "Rollbacks")["targets"][0]["rawSql"])
    assert [(row[0], row[2], row[3]) for row in rows] == [
        (kd.at(40), "config.rollback", "job/llama")
    ]


def test_alert_panels(store: Engine) -> None:
    _, firing = run(store, panel("alerts", "Firing now")["targets"][0]["rawSql"])
    assert [(r[0], r[1], r[2], r[4]) for r in firing] == [(kd.at(50), "gpu-hot", "critical", 91.0)]
    _, recent = run(store, panel("alerts", "Recent alerts")["targets"][0]["rawSql"])
    assert [r[3] for r in recent] == ["firing", "resolved"]
    outcomes = panel("alerts", "Notifications by outcome")["targets"][0]["rawSql"]
    rows = run(store, outcomes, interval_ms=600_000)[1]
    assert rows == [(epoch(kd.at(50)), "failed", 1), (epoch(kd.at(50)), "sent", 2)]
    failed = panel("alerts", "Failed or pending notifications")["targets"][0]["rawSql"]
    assert [(r[2], r[4], r[6]) for r in run(store, failed)[1]] == [("pager", "failed", "HTTP 500")]


def test_cost_panels(store: Engine) -> None:
    def table(title: str, **variables: Variable) -> dict[str, tuple[float, float, float]]:
        _, rows = run(store, panel("cost", title)["targets"][0]["rawSql"], **variables)
        return {row[0]: tuple(float(v) for v in row[1:]) for row in rows}  # type: ignore[misc]

    assert table("Per team") == {
        "nlp": (6.0, 0.0, 1.8),
        "(none)": (6.0, 1.0, 1.8),
        "vision": (3.0, 0.0, 0.9),
    }
    assert table("Per job") == {
        "llama": (6.0, 0.0, 1.8),
        "(none)": (6.0, 1.0, 1.8),
        "bert": (3.0, 0.0, 0.9),
    }
    _, rows = run(store, panel("cost", "Project total")["targets"][0]["rawSql"])
    assert [tuple(float(v) for v in rows[0])] == [(15.0, 1.0, 4.5)]
    # The same figures as the API (tests/api/test_cost_api.py) on sub-periods too.
    total = panel("cost", "Project total")["targets"][0]["rawSql"]
    _, rows = run(store, total, start=kd.T0 + timedelta(hours=2))
    assert [tuple(float(v) for v in rows[0])] == [(5.0, 1.0, 1.5)]
    _, rows = run(
        store, panel("cost", "Per job")["targets"][0]["rawSql"], start=kd.at(75), end=kd.at(105)
    )
    assert {row[0]: tuple(float(v) for v in row[1:]) for row in rows}["llama"] == (1.0, 0.0, 0.3)
    # 0 is not below 0: with the threshold at 0 % nothing is idle.
    assert table("Per team", idle_below=Variable("0"))["(none)"] == (6.0, 0.0, 1.8)


# --------------------------------------------------------------------------- hostile input


def test_hostile_label_values_are_values_not_sql(store: Engine) -> None:
    sql = panel("fleet", "GPU utilization")["targets"][0]["rawSql"]
    _, rows = run(store, sql, host=Variable([kd.HOSTILE], multi=True))
    assert set(series(rows)) == {f"{kd.HOSTILE} gpu 0"}
    for hostile in ("'; DROP TABLE series; --", "\\'; DROP TABLE series; --", "a''b", "$host"):
        for name in ("project", "job"):
            for board in ("fleet", "job", "cost"):
                for panel_json in BOARDS[board]["panels"]:
                    for target in panel_json["targets"]:
                        run(store, target["rawSql"], **{name: Variable(hostile)})
        run(store, sql, host=Variable([hostile, "gpu-node-1"], multi=True))
    # Grafana expands macros after variables, inside quoted values too. The macros that emit
    # quotes emit them in pairs around a timestamp, so what follows stays inside a literal:
    # such a value can break the query, never extend it.
    for hostile in ("$__timeFilter(x) OR true; DROP TABLE series; --", "$__timeFrom() OR true --"):
        for panel_json in BOARDS["fleet"]["panels"]:
            with pytest.raises(DBAPIError):
                run(store, panel_json["targets"][0]["rawSql"], project=Variable(hostile))
    with store.connect() as connection:
        assert {"series", "projects", "samples"} <= set(inspect(connection).get_table_names())
        assert connection.execute(text("SELECT count(*) FROM series")).scalar_one() > 0


def test_every_variable_reaches_sql_quoted() -> None:
    """A variable without ``:sqlstring`` would be pasted unquoted when single-valued."""
    import re

    names = {"project", "host", "gpu", "job", "idle_below"}
    for board, dashboard in BOARDS.items():
        texts = [t["rawSql"] for p in dashboard["panels"] for t in p["targets"]]
        texts += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
        texts += [a["target"]["rawSql"] for a in dashboard["annotations"]["list"] if "target" in a]
        for sql in texts:
            for match in re.finditer(r"\$\{?(\w+)(:\w+)?\}?", sql):
                if match.group(1) in names:
                    assert match.group(0) == f"${{{match.group(1)}:sqlstring}}", (board, sql)
