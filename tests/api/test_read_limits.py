"""Reads stop when their client goes away, on a real server (uvicorn) over SQLite and
PostgreSQL: the statement in progress is cancelled, not left running for nobody."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import Connection, text

from api.read_limits import watch_client
from api.services import series as series_service
from collector.pipeline import Pipeline
from collector.sinks.store import StoreSink
from tests.api.conftest import Minter, bearer
from tests.helpers import api_server, wait_for
from tests.storage.test_deadline import SQLITE_SLOW
from tuneloop.runtime import Runtime
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.writer import SampleWriter


def test_a_read_is_cancelled_when_its_client_disconnects(
    runtime: Runtime, mint: Minter, monkeypatch: pytest.MonkeyPatch
) -> None:
    mint.project("alpha")
    token = bearer(mint.token("alpha", "member", "alice"))
    outcomes: list[BaseException | None] = []
    slow = "SELECT pg_sleep(30)" if runtime.engine.dialect.name == "postgresql" else SQLITE_SLOW

    def slow_list(series: StoreBackend, *_: Any) -> Any:
        # Stands in for a read that takes long (a huge project, a slow disk).
        assert isinstance(series.bind, Connection)
        try:
            series.bind.execute(text(slow)).all()
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)
            raise

    monkeypatch.setattr(series_service, "list_series", slow_list)
    pipeline = Pipeline(StoreSink(SampleWriter(runtime.engine)))
    with api_server(runtime, pipeline) as (url, _server, _thread):
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"{url}/api/v1/projects/alpha/series", headers=token, timeout=0.5)
        wait_for(lambda: bool(outcomes), timeout_s=10, what="the read to stop", every_s=0.05)
    # The raw database error, before the route's bounded block reports it as cancelled.
    assert outcomes[0] is not None
    assert "interrupted" in str(outcomes[0]) or "canceling statement" in str(outcomes[0])


class _Request:
    """A request whose client leaves after ``stays`` looks."""

    def __init__(self, stays: int) -> None:
        self.looks = 0
        self.stays = stays

    async def is_disconnected(self) -> bool:
        self.looks += 1
        return self.looks > self.stays


def test_the_watcher_cancels_only_after_a_disconnect() -> None:
    async def run(stays: int, wait_s: float) -> bool:
        watcher = watch_client(_Request(stays))  # type: ignore[arg-type]
        cancellation = await watcher.__anext__()
        await asyncio.sleep(wait_s)
        await watcher.aclose()
        return cancellation.cancelled

    assert asyncio.run(run(stays=1, wait_s=0.6)) is True
    assert asyncio.run(run(stays=1_000, wait_s=0.3)) is False
