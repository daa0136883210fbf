"""The series API (list, range queries, latest, histogram quantiles) on real SQLite and
PostgreSQL: values, the Prometheus result shape, project isolation, hostile input, 422s."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.services.series import MAX_SERIES_PER_RESPONSE
from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.storage.models import Project, Series
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
T0_UNIX = 1709294400
ALPHA = "/api/v1/projects/alpha"
GAUGE = "DCGM_FI_DEV_GPU_UTIL"
COUNTER = "tokens_total"
HOSTILE = "'; DROP TABLE series; --"
QUOTES = 'it\'s "quoted"; \\ back'


@pytest.fixture
def tokens(mint: Minter) -> dict[str, dict[str, str]]:
    mint.project("alpha")
    mint.project("beta")
    return {
        "alpha": bearer(mint.token("alpha", "agent", "alpha-agent")),
        "beta": bearer(mint.token("beta", "member", "bob")),
        "admin": bearer(mint.admin()),
    }


def write(
    runtime: Runtime,
    project: str,
    metric: str,
    labels: Mapping[str, str],
    samples: Sequence[tuple[float, float]],
    kind: SeriesKind = SeriesKind.GAUGE,
) -> None:
    """``samples`` are (seconds after T0, value)."""
    project_id = _project_id(runtime, project)
    times = [T0 + timedelta(seconds=offset) for offset, _ in samples]
    batch = SeriesBatch(metric, labels, times, [value for _, value in samples], kind=kind)
    assert not SampleWriter(runtime.engine).write(project_id, [batch]).rejected


def _project_id(runtime: Runtime, name: str) -> int:
    with runtime.sessions() as session:
        project_id = session.scalar(select(Project.id).where(Project.name == name))
    assert project_id is not None
    return project_id


def get(client: TestClient, path: str, token: dict[str, str], **params: Any) -> Any:
    response = client.get(ALPHA + path, params=params, headers=token)
    assert response.status_code == 200, response.text
    return response.json()


RANGE = {"start": "2024-03-01T12:00:00Z", "end": str(T0_UNIX + 120), "step": "1m"}


# --------------------------------------------------------------------------- values


def test_series_lists_what_the_selector_matches(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    for gpu in ("0", "1", "10"):
        write(runtime, "alpha", GAUGE, {"gpu": gpu, "job": f"train-{gpu}"}, [(0, 1.0)])
    write(runtime, "alpha", COUNTER, {"gpu": "0"}, [(0, 1.0)], SeriesKind.COUNTER)
    alpha = tokens["alpha"]

    every = get(client, "/series", alpha)["series"]
    by_regex = get(client, "/series", alpha, metric=GAUGE, match=['gpu=~"1.*"'])["series"]
    by_two = get(client, "/series", alpha, match=['job=~"train-.*"', 'gpu!="10"'])["series"]
    by_name = get(client, "/series", alpha, match=['__name__=~"tokens.*"'])["series"]

    assert [(s["metric"], s["labels"]["gpu"]) for s in every] == [
        (GAUGE, "0"), (GAUGE, "1"), (GAUGE, "10"), (COUNTER, "0")
    ]  # fmt: skip
    assert [s["labels"]["gpu"] for s in by_regex] == ["1", "10"]
    assert [s["labels"]["gpu"] for s in by_two] == ["0", "1"]
    assert by_name == [{"metric": COUNTER, "labels": {"gpu": "0"}, "kind": "counter"}]


def test_query_range_has_the_prometheus_matrix_shape(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    write(runtime, "alpha", GAUGE, {"gpu": "0"}, [(0, 1), (10, 5), (20, 3), (70, 8), (60, 2)])
    write(runtime, "alpha", GAUGE, {"gpu": "1"}, [(0, 0.5)])

    body = get(client, "/query_range", tokens["alpha"], metric=GAUGE, **RANGE)
    maxes = get(client, "/query_range", tokens["alpha"], metric=GAUGE, agg="max", **RANGE)
    p50 = get(client, "/query_range", tokens["alpha"], metric=GAUGE, agg="quantile", q=0.5,
              match=['gpu="0"'], **RANGE)  # fmt: skip

    assert body == {
        "resultType": "matrix",
        "result": [
            {
                "metric": {"__name__": GAUGE, "gpu": "0"},
                "values": [[T0_UNIX, "3"], [T0_UNIX + 60, "5"]],
            },
            {"metric": {"__name__": GAUGE, "gpu": "1"}, "values": [[T0_UNIX, "0.5"]]},
        ],
    }
    assert [s["values"] for s in maxes["result"]] == [
        [[T0_UNIX, "5"], [T0_UNIX + 60, "8"]],
        [[T0_UNIX, "0.5"]],
    ]
    assert p50["result"][0]["values"] == [[T0_UNIX, "3"], [T0_UNIX + 60, "5"]]


def test_rate_and_increase_across_a_counter_reset(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    # 0, 10, 20, then a restart: 5, 15, 30, 45, 60 (every 15 s).
    values = [0, 10, 20, 5, 15, 30, 45, 60]
    write(runtime, "alpha", COUNTER, {"gpu": "0"},
          [(15.0 * i, float(v)) for i, v in enumerate(values)], SeriesKind.COUNTER)  # fmt: skip
    alpha = tokens["alpha"]

    increases = get(client, "/query_range", alpha, metric=COUNTER, agg="increase", **RANGE)
    rates = get(client, "/query_range", alpha, metric=COUNTER, agg="rate", **RANGE)
    sliding = get(client, "/query_range", alpha, metric=COUNTER, agg="increase",
                  window="2m", **(RANGE | {"end": str(T0_UNIX + 180)}))  # fmt: skip

    # [0, 60): 10 + 10 + 5 (the reset: grown by 5 since the restart); [60, 120): 10 + 15 + 15
    # + 15. They add up to all the growth: 20 before the restart and 60 after.
    (series,) = increases["result"]
    assert series["metric"] == {"__name__": COUNTER, "gpu": "0"}
    assert series["values"] == [[T0_UNIX, "25"], [T0_UNIX + 60, "55"]]
    assert [float(v) for _, v in rates["result"][0]["values"]] == pytest.approx([25 / 60, 55 / 60])
    # Windows of 2 minutes: [-60, 60), [0, 120), [60, 180).
    assert sliding["result"][0]["values"] == [
        [T0_UNIX, "25"], [T0_UNIX + 60, "80"], [T0_UNIX + 120, "55"]
    ]  # fmt: skip


def test_latest_has_the_prometheus_vector_shape(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    write(runtime, "alpha", GAUGE, {"gpu": "0"}, [(0, 1.0), (30.25, 2.5), (10, 3.0)])
    write(runtime, "alpha", GAUGE, {"gpu": "1"}, [(-86400, 7.0)])
    write(runtime, "alpha", GAUGE, {"gpu": "2"}, [(0, math.inf)])

    body = get(client, "/query/latest", tokens["alpha"], metric=GAUGE)
    recent = get(client, "/query/latest", tokens["alpha"], metric=GAUGE, since=str(T0_UNIX - 60))

    assert body == {
        "resultType": "vector",
        "result": [
            {"metric": {"__name__": GAUGE, "gpu": "0"}, "value": [T0_UNIX + 30.25, "2.5"]},
            {"metric": {"__name__": GAUGE, "gpu": "1"}, "value": [T0_UNIX - 86400, "7"]},
            {"metric": {"__name__": GAUGE, "gpu": "2"}, "value": [T0_UNIX, "+Inf"]},
        ],
    }
    assert [s["metric"]["gpu"] for s in recent["result"]] == ["0", "2"]


def test_histogram_quantile_end_to_end(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    # Cumulative counts at +0, +30, +60, +90 s; job "b" restarted between +30 and +60.
    buckets = {
        ("a", "0.1"): [0, 10, 10, 20], ("a", "0.5"): [0, 30, 40, 50],
        ("a", "1"): [0, 40, 60, 70], ("a", "+Inf"): [0, 40, 80, 80],
        ("b", "0.1"): [5, 15, 2, 4], ("b", "1"): [5, 25, 6, 10], ("b", "+Inf"): [5, 30, 8, 12],
        ("c", "+Inf"): [0, 0, 0, 0],  # no observations: NaN
    }  # fmt: skip
    for (job, le), counts in buckets.items():
        write(runtime, "alpha", "request_seconds_bucket", {"job": job, "le": le},
              list(zip((0, 30, 60, 90), counts, strict=True)), SeriesKind.COUNTER)  # fmt: skip

    body = get(client, "/histogram_quantile", tokens["alpha"], metric="request_seconds",
               q=0.5, **RANGE)  # fmt: skip
    only_b = get(client, "/histogram_quantile", tokens["alpha"], metric="request_seconds",
                 q=0.5, match=['job="b"'], **RANGE)  # fmt: skip
    above_one = get(client, "/histogram_quantile", tokens["alpha"], metric="request_seconds",
                    q=1.5, match=['job="a"'], **RANGE)  # fmt: skip

    assert body["resultType"] == "matrix"
    assert [s["metric"] for s in body["result"]] == [{"job": "a"}, {"job": "b"}, {"job": "c"}]
    a, b, _ = ([(t, float(v)) for t, v in s["values"]] for s in body["result"])
    # a: increases 10, 30, 40, 40 -> 0.1 + 0.4 * 10 / 20; then 10, 20, 30, 40 -> 0.5.
    assert [t for t, _ in a] == [t for t, _ in b] == [T0_UNIX, T0_UNIX + 60]
    assert [value for _, value in a] == pytest.approx([0.3, 0.5])
    # b: 10, 20, 25 -> 0.1 + 0.9 * 2.5 / 10; after the reset 4, 10, 12 -> 0.1 + 0.9 * 2 / 6.
    assert [value for _, value in b] == pytest.approx([0.325, 0.4])
    assert body["result"][2]["values"] == [[T0_UNIX, "NaN"], [T0_UNIX + 60, "NaN"]]
    assert only_b["result"] == [body["result"][1]]
    assert above_one["result"][0]["values"] == [[T0_UNIX, "+Inf"], [T0_UNIX + 60, "+Inf"]]


# --------------------------------------------------------------------------- isolation


ENDPOINTS: list[tuple[str, dict[str, Any]]] = [
    ("/series", {}),
    ("/query_range", {"metric": GAUGE, **RANGE}),
    ("/query/latest", {"metric": GAUGE}),
    ("/histogram_quantile", {"metric": "h", "q": 0.5, **RANGE}),
]


def test_a_project_token_reaches_only_its_own_project(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    write(runtime, "alpha", GAUGE, {"gpu": "0"}, [(0, 1.0)])
    write(runtime, "beta", GAUGE, {"gpu": "0"}, [(0, 99.0)])

    for path, params in ENDPOINTS:
        foreign = client.get(ALPHA + path, params=params, headers=tokens["beta"])
        missing = client.get("/api/v1/projects/nope" + path, params=params, headers=tokens["beta"])
        anonymous = client.get(ALPHA + path, params=params)
        assert foreign.status_code == missing.status_code == 404, path
        assert foreign.json() == {"detail": "project 'alpha' not found", "code": "not_found"}
        assert anonymous.status_code == 401, path
        assert client.get(ALPHA + path, params=params, headers=tokens["admin"]).status_code == 200

    own = client.get("/api/v1/projects/beta/query/latest", headers=tokens["beta"])
    assert [s["value"][1] for s in own.json()["result"]] == ["99"]
    mine = get(client, "/query_range", tokens["alpha"], metric=GAUGE, agg="sum", **RANGE)
    assert [s["values"] for s in mine["result"]] == [[[T0_UNIX, "1"]]]


# --------------------------------------------------------------------------- hostile input


def test_hostile_matcher_values_are_only_data(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    write(runtime, "alpha", GAUGE, {"host": HOSTILE}, [(0, 1.0)])
    write(runtime, "alpha", GAUGE, {"host": QUOTES}, [(0, 2.0)])
    write(runtime, "alpha", GAUGE, {"host": "node-1"}, [(0, 3.0)])
    write(runtime, "alpha", GAUGE, {"we'ird": "x"}, [(0, 4.0)])
    alpha = tokens["alpha"]

    def hosts(*matchers: str) -> list[str]:
        found = get(client, "/series", alpha, metric=GAUGE, match=list(matchers))["series"]
        return [s["labels"].get("host", "") for s in found]

    assert hosts('host="\'; DROP TABLE series; --"') == [HOSTILE]
    assert hosts("host='\\'; DROP TABLE series; --'") == [HOSTILE]
    assert hosts("host=`'; DROP TABLE series; --`") == [HOSTILE]
    assert hosts('host="it\'s \\"quoted\\"; \\\\ back"') == [QUOTES]
    assert hosts("host=~`.*\\\\.*`") == [QUOTES]  # a regex for one literal backslash
    assert hosts('host!~".*(DROP|quoted).*"') == ["node-1", ""]
    assert hosts("host=\"x' OR '1'='1\"") == []
    assert hosts('"we\'ird"="x"') == [""]
    assert hosts('"\'; DROP TABLE series; --"=""') == [HOSTILE, QUOTES, "node-1", ""]
    latest = get(client, "/query/latest", alpha, match=['host="\'; DROP TABLE series; --"'])
    assert [s["value"][1] for s in latest["result"]] == ["1"]
    assert get(client, "/series", alpha, metric=HOSTILE)["series"] == []

    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Series)) == 4


# --------------------------------------------------------------------------- 422


def _loc(*loc: str | int) -> tuple[str, object]:
    return ("loc", ["query", *loc])


BAD_REQUESTS: list[tuple[str, dict[str, Any], tuple[str, object] | str]] = [
    ("/series", {"match": "gpu=0"}, _loc("match", 0)),
    ("/series", {"match": ['gpu="0"', 'gpu="0']}, _loc("match", 1)),
    ("/series", {"match": 'gpu=~"("'}, ("msg", "invalid regular expression '('")),
    ("/series", {"match": 'gpu=="0"'}, ("msg", "must be a quoted string")),
    ("/series", {"match": '{gpu="0"}'}, ("msg", "expected a label name")),
    ("/series", {"match": 'gpu="0",job="x"'}, ("msg", "give one matcher per match")),
    ("/series", {"match": 'gpu="\\q"'}, ("msg", "unknown escape \\q")),
    ("/series", {"match": ['gpu="0"'] * 33}, _loc("match")),
    ("/series", {"metric": ""}, _loc("metric")),
    ("/query_range", {"metric": GAUGE, **RANGE, "start": "yesterday"}, _loc("start")),
    ("/query_range", {"metric": GAUGE, **RANGE, "end": "2024-02-30T00:00:00Z"}, _loc("end")),
    ("/query_range", {"metric": GAUGE, **RANGE, "step": "0"}, ("msg", "more than 0")),
    ("/query_range", {"metric": GAUGE, **RANGE, "step": "1.5"}, ("msg", "whole number")),
    ("/query_range", {"metric": GAUGE, **RANGE, "step": "5x"}, _loc("step")),
    ("/query_range", {"metric": GAUGE, **RANGE, "window": "-1m"}, _loc("window")),
    ("/query_range", {"metric": GAUGE, "start": "1709294400", "step": "60"}, _loc("end")),
    ("/query_range", {"metric": GAUGE, **RANGE, "agg": "median"}, _loc("agg")),
    ("/query_range", {"metric": GAUGE, **RANGE, "q": "half"}, _loc("q")),
    ("/query_range", {"metric": GAUGE, **RANGE, "end": "1709294400"}, "must be after start"),
    ("/query_range", {"metric": GAUGE, **RANGE, "agg": "quantile"}, "quantile needs q in [0, 1]"),
    ("/query_range", {"metric": GAUGE, **RANGE, "agg": "quantile", "q": 2}, "needs q in [0, 1]"),
    ("/query_range", {"metric": GAUGE, **RANGE, "q": 0.5}, "q is only meaningful for quantile"),
    ("/query_range", {"metric": GAUGE, **RANGE, "agg": "rate", "q": 0.5}, "only meaningful"),
    ("/query_range", {"metric": GAUGE, **RANGE, "window": "5m"}, "window is only meaningful"),
    ("/query_range", {"metric": GAUGE, **RANGE, "step": "15", "end": str(T0_UNIX + 2 * 86400)},
     "more than 11000"),
    ("/query_range", {"metric": COUNTER, **RANGE, "agg": "rate", "step": "1",
                      "end": str(T0_UNIX + 11_001)}, "more than 11000"),
    ("/query/latest", {"since": "soon"}, _loc("since")),
    ("/histogram_quantile", {"q": 0.5, **RANGE}, _loc("metric")),
    ("/histogram_quantile", {"metric": "h", **RANGE}, _loc("q")),
    ("/histogram_quantile", {"metric": "h", "q": 0.5, **RANGE, "step": "1s",
                             "end": str(T0_UNIX + 86400)}, "more than 11000"),
]  # fmt: skip


def test_bad_parameters_get_422_with_a_reason(
    client: TestClient, tokens: dict[str, dict[str, str]]
) -> None:
    for path, params, expected in BAD_REQUESTS:
        response = client.get(ALPHA + path, params=params, headers=tokens["alpha"])
        assert response.status_code == 422, (path, params, response.text)
        body = response.json()
        if isinstance(expected, str):
            # Refused by the store: one message saying why.
            assert body["code"] == "invalid_input", body
            assert expected in body["detail"], (path, params, body)
        else:
            # A malformed parameter: FastAPI's problem list, naming the parameter.
            assert body["code"] == "validation_error", body
            key, value = expected
            problem = body["detail"][0]
            if key == "loc":
                assert problem["loc"][: len(value)] == value, (path, params, body)  # type: ignore[arg-type]
            else:
                assert str(value) in problem["msg"], (path, params, body)


def test_regex_only_postgresql_rejects_is_a_422(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    write(runtime, "alpha", GAUGE, {"gpu": "0"}, [(0, 1.0)])
    # Python's named group syntax: valid on SQLite (Python's re), not in PostgreSQL's ARE.
    response = client.get(
        ALPHA + "/query_range",
        params={"metric": GAUGE, "match": 'gpu=~"(?P<n>0)"', **RANGE},
        headers=tokens["alpha"],
    )
    if runtime.engine.dialect.name == "postgresql":
        assert response.status_code == 422
        assert "invalid regular expression" in response.json()["detail"]
    else:
        assert response.status_code == 200
    # The failed statement left nothing behind: the next request works.
    assert get(client, "/series", tokens["alpha"], metric=GAUGE)["series"]


def test_too_many_series_is_a_422(
    client: TestClient, runtime: Runtime, tokens: dict[str, dict[str, str]]
) -> None:
    project_id = _project_id(runtime, "alpha")
    batches = [
        SeriesBatch(GAUGE, {"gpu": str(i)}, [T0], [1.0]) for i in range(MAX_SERIES_PER_RESPONSE + 1)
    ]
    assert not SampleWriter(runtime.engine).write(project_id, batches).rejected
    message = f"the selector matches more than {MAX_SERIES_PER_RESPONSE} series"

    for path, params in ENDPOINTS[:3]:
        response = client.get(ALPHA + path, params=params, headers=tokens["alpha"])
        assert response.status_code == 422, path
        assert message in response.json()["detail"], path
    narrowed = get(client, "/series", tokens["alpha"], metric=GAUGE, match=['gpu=~"1.*"'])
    assert len(narrowed["series"]) == 1 + 10 + 100 + 1000 + 1  # 1, 1x, 1xx, 1xxx, 10000
