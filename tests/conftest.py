"""Shared fixtures: every storage-touching test runs on real SQLite and real PostgreSQL.

PostgreSQL and Redis are required services. A test that cannot reach one fails with the reason;
it never skips (start them with ``.ci/ensure-services``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

import tuneloop.settings
from tests.fresh_store import copy_sqlite, models_schema, reset_postgres, sqlite_template
from tuneloop.settings import get_settings
from tuneloop.storage import make_engine
from tuneloop.storage.models import metadata

POSTGRES_URL = os.environ.get(
    "TUNELOOP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
# One Redis database per pytest-xdist worker (gw0 -> 15, gw1 -> 14, ...): tests flush theirs.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
if _WORKER > 7:  # databases 15..8 only: never flush a low-numbered one someone else uses
    raise RuntimeError("the tests run on at most 8 pytest-xdist workers (Redis databases 15..8)")
REDIS_URL = os.environ.get("TUNELOOP_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{15 - _WORKER}")

BACKENDS = ["sqlite", "postgresql"]

_MODELS_READY = pytest.StashKey[bool]()
"""Set on a test whose PostgreSQL database ``database_url`` gave the models' schema."""


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A database of its own for this test session on the PostgreSQL server, dropped after."""
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"tuneloop_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # pragma: no cover - the reason is the point
        pytest.fail(f"PostgreSQL is required at {POSTGRES_URL} and did not answer: {exc}")
    url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    yield url
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def empty_database_url(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_server_url: str
) -> str:
    """An empty database of the backend named by ``request.param`` (default ``sqlite``)."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'tuneloop.db'}"
    reset_postgres(postgres_server_url)
    return postgres_server_url


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend in turn; on PostgreSQL, for a test that has ``engine``
    too, one with the models' tables (empty) already."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tuneloop.db'}"
    url: str = request.getfixturevalue("postgres_server_url")
    if "engine" in request.fixturenames:
        models_schema(url)  # what the engine fixture would create, emptied: much cheaper
        request.node.stash[_MODELS_READY] = True
    else:
        reset_postgres(url)
    return url


@pytest.fixture(scope="session")
def sqlite_models_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file with the models' tables, made once: tests get copies."""
    return sqlite_template(tmp_path_factory.mktemp("models") / "tuneloop.db")


@pytest.fixture
def engine(
    request: pytest.FixtureRequest, database_url: str, sqlite_models_file: Path
) -> Iterator[Engine]:
    """An engine on each backend in turn, with the schema created from the models."""
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        if not request.node.stash.get(_MODELS_READY, False):
            models_schema(database_url)
        engine = make_engine(database_url)
    else:
        fresh = url.database is not None and copy_sqlite(sqlite_models_file, Path(url.database))
        engine = make_engine(database_url)
        if not fresh:
            metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def redis_url() -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is required at {REDIS_URL} and did not answer: {exc}")
    finally:
        client.close()
    return REDIS_URL


LOCAL_RECEIVERS = "127.0.0.0/8"


@pytest.fixture
def local_receivers_allowed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Test receivers listen on 127.0.0.1, which alert receivers may not reach by default:
    allowed here as an operator allows a network, in the environment (so settings built in the
    test have it too) and in the process's settings."""
    monkeypatch.setenv("TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS", LOCAL_RECEIVERS)
    monkeypatch.setattr(tuneloop.settings, "_current", None)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
