"""Small helpers shared by test modules: ports, a live API server, stored-sample totals,
polling, required tools, and the command line against a SQLite file."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
import uvicorn
from sqlalchemy import Engine, func, select, text
from typer.testing import CliRunner

import tuneloop.settings
from api.main import create_app
from collector.pipeline import Pipeline
from tuneloop.cli import _register_commands
from tuneloop.ports import free_port as free_port  # re-exported for the tests
from tuneloop.runtime import Runtime
from tuneloop.settings import get_settings
from tuneloop.storage import make_engine
from tuneloop.storage.models import metadata, samples


@contextmanager
def api_server(
    runtime: Runtime, pipeline: Pipeline, *, log_level: str = "warning"
) -> Iterator[tuple[str, uvicorn.Server, threading.Thread]]:
    """The API app served by uvicorn on a free port in a background thread; stopped on exit."""
    # On exit, a request still open (an agent's long poll for its next config) is cut at once:
    # the test is over, and waiting for it cost every live-server test a second.
    app = create_app(runtime, pipeline)
    with serving(app, log_level=log_level, timeout_graceful_shutdown=0.1) as served:
        yield served


@contextmanager
def serving(
    app: Any, *, log_level: str = "warning", **config: Any
) -> Iterator[tuple[str, uvicorn.Server, threading.Thread]]:
    """``app`` served by uvicorn (``config``: more ``uvicorn.Config`` options) on a free port in
    a background thread: its base URL, the server and the thread; stopped on exit."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level, **config)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server, thread
    finally:
        server.should_exit = True
        thread.join(15)


def stored_totals(engine: Engine) -> tuple[int, float, int]:
    """(sample count, value sum, number of (series, ts) pairs stored more than once)."""
    with engine.connect() as connection:
        count, value_sum = connection.execute(select(func.count(), func.sum(samples.c.value))).one()
        repeated = connection.execute(
            text(
                "SELECT count(*) FROM (SELECT series_id, ts FROM samples"
                " GROUP BY series_id, ts HAVING count(*) > 1) AS r"
            )
        ).scalar_one()
    return int(count), float(value_sum or 0.0), int(repeated)


def wait_for(
    condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "", *, every_s: float = 0.01
) -> None:
    """Poll ``condition`` every ``every_s`` until it holds; fail naming ``what`` after
    ``timeout_s``. Conditions that query a database want a longer ``every_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(every_s)


def missing(message: str) -> NoReturn:
    """A tool or service the test needs is not here: a failure under CI, a skip elsewhere."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing("promtool not found (.ci/ensure-tools installs it)")
    return found


def sqlite_file(tmp_path: Path, name: str = "cli.db") -> str:
    """The URL of a new SQLite file with every table created."""
    url = f"sqlite:///{tmp_path / name}"
    engine = make_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    return url


@contextmanager
def cli_runner(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """A runner of the ``tuneloop`` command line, every command registered, against
    ``database_url`` and no Redis. The CLI installs its settings process-wide; the previous
    ones are put back on exit."""
    monkeypatch.setattr(tuneloop.settings, "_current", None)
    get_settings.cache_clear()
    _register_commands()
    try:
        yield CliRunner(env={"TUNELOOP_DATABASE_URL": database_url, "TUNELOOP_REDIS_URL": None})
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
