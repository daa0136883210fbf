"""The comparison's two sides over one data set (tests/promql/data.py): a real Prometheus
that reads it from blocks made by promtool, and tuneloop's API over a store holding the same
samples, on SQLite and on PostgreSQL, or (``tsdb_api``) with its series in a real
VictoriaMetrics, remote-written there. Built once per test session (Prometheus) and once per
backend (the store, the TSDB)."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from tests.conftest import reset_postgres
from tests.helpers import promtool
from tests.peers import flush_victoria_metrics, running_prometheus, running_victoria_metrics
from tests.promql import incidents
from tests.promql.data import GenSeries, generate, write_openmetrics
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import metadata
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter


@pytest.fixture(scope="session")
def promql_data() -> list[GenSeries]:
    return [*generate(), *incidents.generate()]


@pytest.fixture(scope="session")
def prometheus_url(
    promql_data: list[GenSeries], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prometheus")
    source = workdir / "data.om.txt"
    write_openmetrics(promql_data, source)
    blocks = workdir / "data"
    subprocess.run(
        [promtool(), "tsdb", "create-blocks-from", "openmetrics", str(source), str(blocks)],
        check=True,
        capture_output=True,
    )
    # A subquery without a step evaluates at this interval: tuneloop's default is 1m too.
    config = {"global": {"scrape_interval": "15s", "evaluation_interval": "1m"}}
    with running_prometheus(
        config, workdir, data_dir=blocks, extra_flags=["--storage.tsdb.retention.time=100y"]
    ) as url:
        yield url


@dataclass
class Tuneloop:
    client: TestClient
    headers: dict[str, str]
    other_headers: dict[str, str]
    """A token of another project, which holds series of its own."""
    admin_headers: dict[str, str]

    def get(self, path: str, params: dict[str, str]) -> Any:
        response = self.client.get(path, params=params, headers=self.headers)
        return response


def load(runtime: Runtime, project_id: int, data: list[GenSeries]) -> None:
    writer: TimeSeriesBackend | SampleWriter = runtime.remote_series or SampleWriter(runtime.engine)
    batches = [
        SeriesBatch(
            one.metric,
            one.labels,
            [datetime.fromtimestamp(t / 1000, tz=UTC) for t in one.times_ms],
            one.values,
            SeriesKind.COUNTER if one.counter else SeriesKind.GAUGE,
        )
        for one in data
    ]
    result = writer.write(project_id, batches)
    assert not result.rejected, result.rejected[:3]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def tuneloop_api(
    request: pytest.FixtureRequest,
    promql_data: list[GenSeries],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Tuneloop]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'tuneloop.db'}"
    else:
        url = request.getfixturevalue("postgres_server_url")
        reset_postgres(url)
    yield from _serve(url, promql_data, None)


@pytest.fixture(scope="module")
def tsdb_api(
    promql_data: list[GenSeries], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tuneloop]:
    """tuneloop's API with its series in a real VictoriaMetrics (``TUNELOOP_TSDB_URL``)."""
    workdir = tmp_path_factory.mktemp("victoria-metrics")
    with running_victoria_metrics(workdir) as vm_url:
        remote = PrometheusBackend(vm_url, project_label=f"p{random.randrange(10**9)}")
        url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'tuneloop.db'}"
        try:
            yield from _serve(
                url, promql_data, remote, settle=lambda: flush_victoria_metrics(vm_url)
            )
        finally:
            remote.close()


def _serve(
    url: str,
    promql_data: list[GenSeries],
    remote: PrometheusBackend | None,
    settle: Callable[[], None] = lambda: None,
) -> Iterator[Tuneloop]:
    engine = make_engine(url)
    metadata.create_all(engine)
    runtime = Runtime(
        settings=Settings(database_url=url, redis_url=None),
        engine=engine,
        sessions=session_factory(engine),
        remote_series=remote,
    )
    with session_scope(runtime.sessions) as session:
        project = accounts.create_project(session, "fleet")
        other = accounts.create_project(session, "other")
        _, secret = accounts.create_token(session, project, "grafana", "member")
        _, other_secret = accounts.create_token(session, other, "grafana", "member")
        _, admin_secret = accounts.create_token(session, None, "root", "admin")
        ids = project.id, other.id
    load(runtime, ids[0], promql_data)
    # The other project has series of the same names, with other values.
    load(runtime, ids[1], [_shifted(one) for one in promql_data[:12]])
    settle()
    with TestClient(create_app(runtime)) as client:
        yield Tuneloop(
            client,
            {"Authorization": f"Bearer {secret}"},
            {"Authorization": f"Bearer {other_secret}"},
            {"Authorization": f"Bearer {admin_secret}"},
        )
    engine.dispose()


def _shifted(one: GenSeries) -> GenSeries:
    return GenSeries(
        one.metric, {**one.labels, "tenant": "other"}, one.counter, one.times_ms,
        [v + 1000 for v in one.values],
    )  # fmt: skip
