"""An API app with a running write pipeline, on each backend (real SQLite, real PostgreSQL)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from collector.pipeline import Pipeline, PipelineConfig
from collector.sinks.store import StoreSink
from tests.api.conftest import Minter
from tests.helpers import api_server
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import session_factory
from tuneloop.storage.timeseries.writer import SampleWriter

MAX_BODY = 64 * 1024
"""The body limit of the test app: small, so 413s cost little to provoke."""

T = TypeVar("T")


def eventually(probe: Callable[[], T], timeout_s: float = 5.0) -> T:
    """``probe()`` once it returns something truthy (the pipeline writes asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.02)


@pytest.fixture
def runtime(engine: Engine, database_url: str, tmp_path: Path) -> Runtime:
    settings = Settings(
        database_url=database_url, redis_url=None, data_dir=tmp_path, otlp_max_body_bytes=MAX_BODY
    )
    return Runtime(settings=settings, engine=engine, sessions=session_factory(engine))


def make_pipeline(runtime: Runtime, **config: float) -> Pipeline:
    writer = SampleWriter(runtime.engine)
    return Pipeline(StoreSink(writer), config=PipelineConfig(flush_interval_s=0.02, **config))  # type: ignore[arg-type]


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
def mint(runtime: Runtime) -> Minter:
    return Minter(runtime)


@pytest.fixture
def server(runtime: Runtime, pipeline: Pipeline) -> Iterator[str]:
    """The API app served by uvicorn on a free port, in a background thread."""
    with api_server(runtime, pipeline) as (url, _, _):
        yield url
