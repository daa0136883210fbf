"""An API app on each backend (real SQLite, real PostgreSQL), with helpers to mint tokens."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import session_factory, session_scope


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@dataclass
class Minter:
    """Creates projects and tokens straight in the store, as an operator would with the CLI."""

    runtime: Runtime

    def admin(self, name: str = "root") -> str:
        with session_scope(self.runtime.sessions) as session:
            _, secret = accounts.create_token(session, None, name, "admin")
        return secret

    def project(self, name: str) -> int:
        with session_scope(self.runtime.sessions) as session:
            return accounts.create_project(session, name).id

    def token(self, project: str, role: str = "member", name: str = "t") -> str:
        with session_scope(self.runtime.sessions) as session:
            owner = accounts.get_project_by_name(session, project)
            assert owner is not None
            _, secret = accounts.create_token(session, owner, name, role)
        return secret


@pytest.fixture
def runtime(engine: Engine, database_url: str) -> Runtime:
    settings = Settings(database_url=database_url, redis_url=None)
    return Runtime(settings=settings, engine=engine, sessions=session_factory(engine))


@pytest.fixture
def client(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime)) as test_client:
        yield test_client


@pytest.fixture
def mint(runtime: Runtime) -> Minter:
    return Minter(runtime)
