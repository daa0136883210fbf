"""POST /api/v1/write on real SQLite and PostgreSQL: the statuses a Prometheus receiver gives,
what is kept of a request that is refused in part, authentication, and what ends up stored."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import cramjam
import httpx
import pytest
from fastapi.testclient import TestClient
from httpx import Response

from api.main import create_app
from collector.pipeline import Pipeline
from tests.api.conftest import Minter, bearer
from tests.helpers import wait_for
from tests.otlp.conftest import make_pipeline
from tests.remote_write.conftest import MAX_BODY, Stored, series_kinds, stored_series
from tuneloop import remote_write
from tuneloop.remote_write import RemoteSeries
from tuneloop.runtime import Runtime

T0 = 1_750_000_000_000


@pytest.fixture
def alpha(mint: Minter) -> tuple[int, dict[str, str]]:
    project_id = mint.project("alpha")
    return project_id, bearer(mint.token("alpha", "agent", "prometheus"))


def post(client: TestClient, body: bytes, token: dict[str, str], **headers: str) -> Response:
    return client.post(
        "/api/v1/write", content=body, headers={**remote_write.HEADERS, **token, **headers}
    )


def raw_body(*items: RemoteSeries) -> bytes:
    """A body with the labels exactly as given (duplicates, empty values, no name)."""
    return remote_write.encode(items)


def received(pipeline: Pipeline) -> float:
    return pipeline.registry.get_sample_value("tuneloop_collector_points_received_total") or 0.0


def wait_stored(runtime: Runtime, project_id: int, samples: int) -> Stored:
    def enough() -> bool:
        found = stored_series(runtime.engine, project_id)
        return sum(len(v) for v in found.values()) >= samples

    wait_for(enough, 10, f"{samples} samples stored", every_s=0.05)
    return stored_series(runtime.engine, project_id)


def test_a_write_is_stored_and_answered_204(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    body = remote_write.encode(
        [
            remote_write.series("gpu_utilization", {"gpu": "0"}, [T0, T0 + 1000], [0.5, 0.75]),
            remote_write.series("train_steps_total", {"job": "llm"}, [T0], [42.0]),
        ]
    )
    response = post(client, body, token)
    assert response.status_code == 204, response.text
    stored = wait_stored(runtime, project_id, 3)
    assert stored == {
        ("gpu_utilization", frozenset({("gpu", "0")})): [(T0, 0.5), (T0 + 1000, 0.75)],
        ("train_steps_total", frozenset({("job", "llm")})): [(T0, 42.0)],
    }
    assert series_kinds(runtime.engine, project_id) == {
        "gpu_utilization": "gauge",
        "train_steps_total": "counter",
    }


def test_bad_snappy_and_bad_protobuf_are_400_and_keep_nothing(
    client: TestClient, runtime: Runtime, pipeline: Pipeline, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    bad_snappy = post(client, b"\xff\xff\xff\xff not snappy", token)
    assert bad_snappy.status_code == 400
    assert "snappy" in bad_snappy.text
    bad_proto = post(client, bytes(cramjam.snappy.compress_raw(b"\x0a\xff\x01zz")), token)
    assert bad_proto.status_code == 400
    assert "protobuf" in bad_proto.text
    assert received(pipeline) == 0
    assert stored_series(runtime.engine, project_id) == {}


def test_refused_series_give_400_and_the_rest_is_kept(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    body = raw_body(
        RemoteSeries([("__name__", "ok_gauge"), ("a", "1")], [T0], [1.0]),
        RemoteSeries([("__name__", "dup"), ("a", "1"), ("a", "2")], [T0], [2.0]),
        RemoteSeries([("a", "no name")], [T0], [3.0]),
        RemoteSeries([("__name__", "bad-name")], [T0], [4.0]),
        RemoteSeries([("__name__", "bad_label"), ("0a", "x")], [T0], [5.0]),
    )
    response = post(client, body, token)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("text/plain")
    for reason in (
        "duplicate label name 'a'",
        "missing metric name",
        "invalid metric name",
        "invalid label name '0a'",
    ):
        assert reason in response.text
    stored = wait_stored(runtime, project_id, 1)
    assert stored == {("ok_gauge", frozenset({("a", "1")})): [(T0, 1.0)]}


def test_out_of_order_and_duplicate_samples_are_refused_the_rest_kept(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    stamps = [T0, T0 + 2000, T0 + 1000, T0 + 2000, T0 + 2000, T0 + 3000]
    values = [1.0, 2.0, 9.0, 2.0, 7.0, 3.0]
    # Sample 3 is out of order, 4 repeats sample 2 exactly (fine), 5 repeats its time with
    # another value.
    response = post(client, raw_body(remote_write.series("g", {}, stamps, values)), token)
    assert response.status_code == 400
    assert "1 out-of-order sample" in response.text
    assert "1 duplicate sample" in response.text
    stored = wait_stored(runtime, project_id, 3)
    assert stored == {("g", frozenset()): [(T0, 1.0), (T0 + 2000, 2.0), (T0 + 3000, 3.0)]}


def test_empty_label_values_mean_no_label(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    body = raw_body(RemoteSeries([("__name__", "g"), ("empty", ""), ("gpu", "1")], [T0], [1.0]))
    assert post(client, body, token).status_code == 204
    assert wait_stored(runtime, project_id, 1) == {("g", frozenset({("gpu", "1")})): [(T0, 1.0)]}


def test_stale_markers_are_not_stored_and_not_an_error(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    stale = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]  # Prometheus's
    body = raw_body(remote_write.series("g", {}, [T0, T0 + 1000], [1.0, stale]))
    assert post(client, body, token).status_code == 204
    assert wait_stored(runtime, project_id, 1) == {("g", frozenset()): [(T0, 1.0)]}


def test_a_body_over_the_limit_is_413(
    client: TestClient, pipeline: Pipeline, alpha: tuple[int, dict[str, str]]
) -> None:
    _, token = alpha
    response = post(client, b"x" * (MAX_BODY + 1), token)
    assert response.status_code == 413
    assert received(pipeline) == 0


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Encoding": "gzip"},
        {"Content-Type": "application/json"},
        {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
    ],
)
def test_other_encodings_are_415(
    client: TestClient, alpha: tuple[int, dict[str, str]], headers: dict[str, str]
) -> None:
    _, token = alpha
    body = remote_write.encode([remote_write.series("g", {}, [T0], [1.0])])
    assert post(client, body, token, **headers).status_code == 415


def test_tokens_are_checked_like_every_route(client: TestClient, mint: Minter) -> None:
    body = remote_write.encode([remote_write.series("g", {}, [T0], [1.0])])
    assert client.post("/api/v1/write", content=body).status_code == 401
    assert post(client, body, bearer("tl_not_a_token")).status_code == 401
    assert post(client, body, bearer(mint.admin())).status_code == 403
    mint.project("beta")
    assert post(client, body, bearer(mint.token("beta", "member"))).status_code == 204


def test_a_full_pipeline_is_503_with_retry_after(
    runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    _, token = alpha
    stopped = make_pipeline(runtime)
    stopped.stop()  # refuses every submission, as a full one does
    body = remote_write.encode([remote_write.series("g", {}, [T0], [1.0])])
    with TestClient(create_app(runtime, stopped)) as client:
        response = post(client, body, token)
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1


def test_the_route_is_in_the_openapi_schema(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/api/v1/write"]["post"]
    assert {"204", "400", "413", "415", "503"} <= set(operation["responses"])


def test_a_time_beyond_the_store_is_refused_the_rest_kept(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    beyond = 400_000_000_000_000  # year 14,645
    body = raw_body(remote_write.series("g", {}, [T0, beyond], [1.0, 2.0]))
    response = post(client, body, token)
    assert response.status_code == 400
    assert "1 sample(s) with a time out of range" in response.text
    assert wait_stored(runtime, project_id, 1) == {("g", frozenset()): [(T0, 1.0)]}


def test_a_streamed_body_is_cut_off_at_the_limit(
    server: str, alpha: tuple[int, dict[str, str]]
) -> None:
    """Without Content-Length (chunked), the limit applies while reading."""
    _, token = alpha

    def chunks() -> Iterator[bytes]:
        for _ in range(2 * MAX_BODY // 1024):
            yield b"x" * 1024

    headers = {**remote_write.HEADERS, **token}
    response = httpx.post(f"{server}/api/v1/write", content=chunks(), headers=headers)
    assert response.status_code == 413
