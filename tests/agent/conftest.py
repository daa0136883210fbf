"""A live API server (uvicorn, real write pipeline) on each backend, and a project with an
agent token and a member token for the job agent's tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.api.conftest import Minter
from tests.helpers import api_server
from tests.otlp.conftest import make_pipeline
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import session_factory


@dataclass(frozen=True)
class Live:
    url: str
    runtime: Runtime
    agent_token: str
    member_token: str
    project: str = "alpha"

    def job_url(self, job: str) -> str:
        return f"{self.url}/api/v1/projects/{self.project}/jobs/{job}"


@pytest.fixture
def runtime(engine: Engine, database_url: str, tmp_path: Path) -> Runtime:
    settings = Settings(database_url=database_url, redis_url=None, data_dir=tmp_path)
    return Runtime(settings=settings, engine=engine, sessions=session_factory(engine))


@pytest.fixture
def live(runtime: Runtime) -> Iterator[Live]:
    mint = Minter(runtime)
    mint.project("alpha")
    agent_token = mint.token("alpha", "agent", "trainer")
    member_token = mint.token("alpha", "member", "alice")
    pipeline = make_pipeline(runtime)
    pipeline.start()
    try:
        with api_server(runtime, pipeline) as (url, _, _):
            yield Live(url, runtime, agent_token, member_token)
    finally:
        pipeline.stop()
