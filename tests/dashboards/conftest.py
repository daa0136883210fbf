"""A PostgreSQL store filled from the real dcgm-exporter captures, for the SQL boards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from tests.alerts.conftest import at
from tests.captures import scraping, serving_pages
from tests.conftest import reset_postgres
from tuneloop import accounts
from tuneloop.storage import make_engine, migrate, session_factory, session_scope

CAPTURES_PROJECT = "captures"
CAPTURES_END_S = 600


@pytest.fixture(scope="module")
def captures_store(postgres_server_url: str) -> Iterator[Engine]:
    """The store as ``tuneloop db upgrade`` builds it, the four exporters of tests/captures.py
    scraped every 30 s for ten minutes into the project ``captures``."""
    reset_postgres(postgres_server_url)
    migrate.upgrade(postgres_server_url)
    engine = make_engine(postgres_server_url)
    with session_scope(session_factory(engine)) as session:
        project_id = accounts.create_project(session, CAPTURES_PROJECT).id
    with serving_pages() as (base, _), scraping(engine, project_id, base) as scraper:
        for t in range(0, CAPTURES_END_S + 1, 30):
            scraper.scrape(at(t))
    yield engine
    engine.dispose()
