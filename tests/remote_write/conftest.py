"""An API app with a running write pipeline on each backend, and a direct read of the store."""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeAlias

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from api.main import create_app
from collector.pipeline import Pipeline
from tests.api.conftest import Minter
from tests.helpers import api_server
from tests.otlp.conftest import make_pipeline
from tests.peers import flush_victoria_metrics
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import session_factory
from tuneloop.storage.models import Series, samples

MAX_BODY = 64 * 1024
"""The body limit of the test app: small, so 413s cost little to provoke."""

SeriesKey: TypeAlias = tuple[str, frozenset[tuple[str, str]]]
Stored: TypeAlias = dict[SeriesKey, list[tuple[int, float]]]


@pytest.fixture
def runtime(engine: Engine, database_url: str, tmp_path: Path) -> Runtime:
    settings = Settings(
        database_url=database_url,
        redis_url=None,
        data_dir=tmp_path,
        remote_write_max_body_bytes=MAX_BODY,
    )
    return Runtime(settings=settings, engine=engine, sessions=session_factory(engine))


@pytest.fixture
def pipeline(runtime: Runtime) -> Iterator[Pipeline]:
    pipeline = make_pipeline(runtime)
    pipeline.start()
    yield pipeline
    pipeline.stop()


@pytest.fixture
def client(runtime: Runtime, pipeline: Pipeline) -> Iterator[TestClient]:
    with TestClient(create_app(runtime, pipeline)) as test_client:
        yield test_client


@pytest.fixture
def server(runtime: Runtime, pipeline: Pipeline) -> Iterator[str]:
    with api_server(runtime, pipeline) as (url, _, _):
        yield url


@pytest.fixture
def mint(runtime: Runtime) -> Minter:
    return Minter(runtime)


def stored_series(engine: Engine, project_id: int) -> Stored:
    """Every series of the project read straight from the store: (metric, labels) -> its
    samples as (milliseconds since the epoch, value), in time order."""
    query = (
        select(Series.metric, Series.labels, samples.c.ts, samples.c.value)
        .join(samples, samples.c.series_id == Series.id)
        .where(Series.project_id == project_id)
        .order_by(Series.id, samples.c.ts)
    )
    out: Stored = {}
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    with engine.connect() as connection:
        for metric, labels, ts, value in connection.execute(query):
            key = (metric, frozenset(labels.items()))
            millis = (ts - epoch) // timedelta(milliseconds=1)
            out.setdefault(key, []).append((millis, value))
    return out


def series_kinds(engine: Engine, project_id: int) -> dict[str, str]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(Series.metric, Series.kind).where(Series.project_id == project_id)
        )
        return {metric: kind for metric, kind in rows}


def exported(url: str, project_id: int) -> Stored:
    """Every series VictoriaMetrics holds for the project, less the project label."""
    flush_victoria_metrics(url)
    query = urllib.parse.urlencode({"match[]": f'{{tuneloop_project="{project_id}"}}'})
    with urllib.request.urlopen(f"{url}/api/v1/export?{query}", timeout=30) as response:
        lines = response.read().decode().splitlines()
    out: Stored = {}
    for line in lines:
        item = json.loads(line)
        labels = dict(item["metric"])
        metric = labels.pop("__name__")
        assert labels.pop("tuneloop_project") == str(project_id)
        samples = sorted(zip(item["timestamps"], item["values"], strict=True))
        out[(metric, frozenset(labels.items()))] = [(ts, float(v)) for ts, v in samples]
    return out


def assert_same(vm: Stored, store: Stored) -> None:
    """Equal series, timestamps and values; values to VictoriaMetrics' precision (it keeps 12
    significant decimal digits, so 0.53 may read back as 0.5299999999999999)."""
    assert set(vm) == set(store)
    for key, points in store.items():
        assert [ts for ts, _ in vm[key]] == [ts for ts, _ in points], key
        for (_, got), (_, want) in zip(vm[key], points, strict=True):
            assert math.isclose(got, want, rel_tol=1e-12), (key, got, want)
