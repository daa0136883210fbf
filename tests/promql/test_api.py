"""The Prometheus API's other side: series and label look-ups compared with Prometheus, its
errors as Prometheus gives them (400 bad_data, 422 execution, 503 timeout), the sample limit
refusing before any sample is read, and projects kept apart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import tuneloop.settings
from api.services import promql as promql_service
from tests.peers import prom_api
from tests.promql.conftest import Tuneloop
from tests.promql.data import T0_S
from tuneloop.settings import get_settings
from tuneloop.storage.timeseries import raw

UTIL = "DCGM_FI_DEV_GPU_UTIL"
SPAN = {"start": str(T0_S - 60), "end": str(T0_S + 3700)}


def _error(response: Any, status: int, error_type: str) -> str:
    body = response.json()
    assert response.status_code == status, body
    assert body["status"] == "error" and body["errorType"] == error_type, body
    return str(body["error"])


def _data(response: Any) -> Any:
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", body
    return body["data"]


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


@pytest.mark.parametrize(
    "match",
    [[UTIL], [f'{UTIL}{{Hostname="node-a"}}', 'tuneloop_step_duration_seconds{job=~"v.*"}']],
)
def test_series_match_prometheus(
    match: list[str], tuneloop_api: Tuneloop, prometheus_url: str
) -> None:
    params: dict[str, Any] = {"match[]": match, **SPAN}
    ours = _data(
        tuneloop_api.client.get("/api/v1/series", params=params, headers=tuneloop_api.headers)
    )
    theirs = prom_api(prometheus_url, "/api/v1/series", {"match[]": match[0], **SPAN})
    if len(match) > 1:
        theirs += prom_api(prometheus_url, "/api/v1/series", {"match[]": match[1], **SPAN})
    assert sorted(map(_key, ours)) == sorted(map(_key, theirs))


def test_labels_and_values_match_prometheus(tuneloop_api: Tuneloop, prometheus_url: str) -> None:
    get = tuneloop_api.client.get
    ours = _data(get("/api/v1/labels", params=SPAN, headers=tuneloop_api.headers))
    assert ours == prom_api(prometheus_url, "/api/v1/labels", SPAN)
    for name in ("Hostname", "__name__", "GPU_I_PROFILE", "le"):
        path = f"/api/v1/label/{name}/values"
        ours = _data(get(path, params=SPAN, headers=tuneloop_api.headers))
        assert ours == prom_api(prometheus_url, path, SPAN), name
    params = {"match[]": f'{UTIL}{{Hostname="node-c"}}', **SPAN}
    ours = _data(get("/api/v1/label/gpu/values", params=params, headers=tuneloop_api.headers))
    assert ours == prom_api(prometheus_url, "/api/v1/label/gpu/values", params) == ["0", "1"]


@pytest.mark.parametrize(
    "expression", [f"{UTIL}[1m]", f'{UTIL}{{gpu="1"}}[2m] offset 1m', f"sum({UTIL})[5m:1m]"]
)
def test_an_instant_range_vector_gives_raw_samples(
    expression: str, tuneloop_api: Tuneloop, prometheus_url: str
) -> None:
    params = {"query": expression, "time": str(T0_S + 907)}
    ours = _data(tuneloop_api.get("/api/v1/query", params))
    theirs = prom_api(prometheus_url, "/api/v1/query", params)
    assert ours["resultType"] == theirs["resultType"] == "matrix"
    by_labels = {_key(s["metric"]): s["values"] for s in theirs["result"]}
    mine = {_key(s["metric"]): s["values"] for s in ours["result"]}
    assert mine.keys() == by_labels.keys()
    for key, values in by_labels.items():
        assert [t for t, _ in mine[key]] == [t for t, _ in values]
        for (_, a), (_, b) in zip(mine[key], values, strict=True):
            assert abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))


def test_post_form_as_grafana_sends(tuneloop_api: Tuneloop) -> None:
    form = {"query": f"sum({UTIL})", "start": str(T0_S + 60), "end": str(T0_S + 600), "step": "60"}
    data = _data(
        tuneloop_api.client.post("/api/v1/query_range", data=form, headers=tuneloop_api.headers)
    )
    assert data["resultType"] == "matrix"
    assert [point[0] for point in data["result"][0]["values"]] == list(
        range(T0_S + 60, T0_S + 601, 60)
    )
    data = _data(
        tuneloop_api.client.post(
            "/api/v1/query", data={"query": "1", "time": "100"}, headers=tuneloop_api.headers
        )
    )
    assert data == {"resultType": "scalar", "result": [100, "1"]}


def test_times_and_steps_as_prometheus_parses_them(
    tuneloop_api: Tuneloop, prometheus_url: str
) -> None:
    params = {
        "query": f"max({UTIL})",
        "start": "2023-11-14T22:15:00Z",
        "end": "2023-11-14T22:45:00.5Z",
        "step": "2m30s",
    }
    ours = _data(tuneloop_api.get("/api/v1/query_range", params))
    assert ours == prom_api(prometheus_url, "/api/v1/query_range", params)


def test_a_project_sees_only_its_own_series(tuneloop_api: Tuneloop) -> None:
    client, other = tuneloop_api.client, tuneloop_api.other_headers
    data = _data(
        client.get("/api/v1/query", params={"query": UTIL, "time": str(T0_S + 600)}, headers=other)
    )
    assert data["result"] and all(s["metric"]["tenant"] == "other" for s in data["result"])
    mine = _data(tuneloop_api.get("/api/v1/query", {"query": UTIL, "time": str(T0_S + 600)}))
    assert not any("tenant" in s["metric"] for s in mine["result"])
    names = _data(client.get("/api/v1/label/__name__/values", headers=other))
    assert "tuneloop_step_duration_seconds_bucket" not in names
    series = _data(
        client.get("/api/v1/series", params={"match[]": '{__name__=~".+"}'}, headers=other)
    )
    assert series and all(s["tenant"] == "other" for s in series)


def test_an_unsupported_function_is_named(tuneloop_api: Tuneloop) -> None:
    response = tuneloop_api.get("/api/v1/query", {"query": f"deriv({UTIL}[5m])"})
    assert "deriv()" in _error(response, 400, "bad_data")
    response = tuneloop_api.get("/api/v1/query", {"query": f'count_values("v", {UTIL})'})
    assert "count_values" in _error(response, 400, "bad_data")
    response = tuneloop_api.get("/api/v1/query", {"query": f"predict_linear({UTIL}[1h], 60)"})
    assert "predict_linear()" in _error(response, 400, "bad_data")


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"query": "sum(rate(x[5m])"}, "parse error"),
        ({"query": ""}, "parse error"),
        ({"query": "x", "time": "yesterday"}, "time"),
        ({"query": 'x{a=~"("}'}, "parse error"),
    ],
)
def test_bad_queries_are_bad_data(
    params: dict[str, str], words: str, tuneloop_api: Tuneloop
) -> None:
    assert words in _error(tuneloop_api.get("/api/v1/query", params), 400, "bad_data")


@pytest.mark.parametrize(
    ("start", "end", "step", "words"),
    [
        (T0_S, T0_S + 60, "0", "zero or negative"),
        (T0_S + 60, T0_S, "15", "end timestamp must not be before start"),
        (T0_S, T0_S + 86_400 * 7, "15", "11,000 points"),
        (T0_S, T0_S + 60, "soon", "step"),
    ],
)
def test_bad_ranges_are_bad_data(
    start: int, end: int, step: str, words: str, tuneloop_api: Tuneloop
) -> None:
    params = {"query": UTIL, "start": str(start), "end": str(end), "step": step}
    assert words in _error(tuneloop_api.get("/api/v1/query_range", params), 400, "bad_data")


def test_a_range_vector_is_no_range_query(tuneloop_api: Tuneloop) -> None:
    params = {"query": f"{UTIL}[5m]", "start": str(T0_S), "end": str(T0_S + 60), "step": "15"}
    assert "range vector" in _error(
        tuneloop_api.get("/api/v1/query_range", params), 400, "bad_data"
    )


@pytest.fixture
def max_samples(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setenv("TUNELOOP_PROMQL_MAX_SAMPLES", "1000")
    monkeypatch.setattr(tuneloop.settings, "_current", None)
    get_settings.cache_clear()
    yield 1000
    get_settings.cache_clear()


def test_too_many_samples_are_refused_before_any_is_read(
    max_samples: int, tuneloop_api: Tuneloop, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[object] = []
    real_read = raw.read

    def counted_read(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(raw, "read", counted_read)
    # 31 GPUs and MIG instances x 20 samples in 5 minutes: within the limit.
    params = {"query": f"rate({UTIL}[5m])", "time": str(T0_S + 1200)}
    assert _data(tuneloop_api.get("/api/v1/query", params))["result"]
    assert len(reads) == 1
    # 31 x 80 samples in 20 minutes: more than 1000, refused before a read.
    params = {"query": f"sum(rate({UTIL}[20m])) + sum({UTIL})", "time": str(T0_S + 1500)}
    error = _error(tuneloop_api.get("/api/v1/query", params), 422, "execution")
    assert "too many samples" in error and str(max_samples) in error
    assert len(reads) == 1


def test_too_many_points_in_memory_are_refused(max_samples: int, tuneloop_api: Tuneloop) -> None:
    # One series, 240 samples in the hour, but a value for each of 3,601 steps.
    params = {
        "query": f'{UTIL}{{Hostname="node-a", gpu="1"}}',
        "start": str(T0_S),
        "end": str(T0_S + 3600),
        "step": "1",
    }
    error = _error(tuneloop_api.get("/api/v1/query_range", params), 422, "execution")
    assert "1 series x 3601 steps" in error
    params["step"] = "15"
    assert len(_data(tuneloop_api.get("/api/v1/query_range", params))["result"]) == 1


def test_an_evaluation_past_its_timeout_stops(tuneloop_api: Tuneloop) -> None:
    params = {
        "query": f"max_over_time({UTIL}[1h])",
        "start": str(T0_S),
        "end": str(T0_S + 3600),
        "step": "1",
        "timeout": "1ms",
    }
    assert "timed out" in _error(tuneloop_api.get("/api/v1/query_range", params), 503, "timeout")


def test_grafana_probes_answer(tuneloop_api: Tuneloop) -> None:
    info = _data(tuneloop_api.get("/api/v1/status/buildinfo", {}))
    assert info["version"].count(".") == 2
    metadata = _data(tuneloop_api.get("/api/v1/metadata", {}))
    assert metadata[UTIL] == [{"type": "gauge", "help": "", "unit": ""}]
    assert metadata["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["type"] == "counter"
    assert _data(tuneloop_api.get("/api/v1/query_exemplars", {"query": UTIL})) == []
    assert _data(tuneloop_api.get("/api/v1/rules", {})) == {"groups": []}


def test_without_a_project_token_nothing_is_answered(tuneloop_api: Tuneloop) -> None:
    response = tuneloop_api.client.get("/api/v1/query", params={"query": "1"})
    assert response.status_code == 401
    response = tuneloop_api.client.get(
        "/api/v1/query", params={"query": UTIL}, headers=tuneloop_api.admin_headers
    )
    assert "project's token" in _error(response, 403, "bad_data")


def test_too_many_series_is_an_execution_error(
    tuneloop_api: Tuneloop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(promql_service, "MAX_SERIES_PER_RESPONSE", 3)
    params = {"query": f"sum({UTIL})", "time": str(T0_S + 600)}
    assert "more than 3 series" in _error(
        tuneloop_api.get("/api/v1/query", params), 422, "execution"
    )


def test_the_series_api_refuses_promql(tuneloop_api: Tuneloop) -> None:
    response = tuneloop_api.client.get(
        "/api/v1/projects/fleet/series",
        params={"metric": UTIL, "query": f"sum({UTIL})"},
        headers=tuneloop_api.headers,
    )
    assert response.status_code == 422
    assert "/api/v1/query" in str(response.json()["detail"])
