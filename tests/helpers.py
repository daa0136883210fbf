"""Small helpers shared by test modules: ports, a live API server, stored-sample totals."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from sqlalchemy import Engine, func, select, text

from api.main import create_app
from collector.pipeline import Pipeline
from tuneloop.runtime import Runtime
from tuneloop.storage.models import samples


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def api_server(
    runtime: Runtime, pipeline: Pipeline, *, log_level: str = "warning"
) -> Iterator[tuple[str, uvicorn.Server, threading.Thread]]:
    """The API app served by uvicorn on a free port in a background thread; stopped on exit."""
    port = free_port()
    config = uvicorn.Config(
        create_app(runtime, pipeline), host="127.0.0.1", port=port, log_level=log_level
    )
    server = uvicorn.Server(config)
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
