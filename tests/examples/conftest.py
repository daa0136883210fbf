"""The agent tests' live API server (uvicorn, real write pipeline) on SQLite only: the example
talks to tuneloop's API alone, whose backends the agent and API tests cover both of; one
backend keeps these tests, which start real replica processes, short."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.conftest import live, runtime

__all__ = ["live", "runtime"]


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuneloop.db'}"
