"""The load generator's HTTP client against a real uvicorn server: idle connections expire before
the server closes them, and a reused connection the server closed is retried on a fresh one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from examples.inference.wire import Pool, WireError
from tests.helpers import free_port, serving


@pytest.fixture
def quick_closing_server() -> Iterator[str]:
    """Closes a connection idle for 0.3 s, as uvicorn closes one idle for 5 s by default."""
    app = FastAPI()

    @app.post("/predict")
    def predict(body: dict[str, list[float]]) -> dict[str, int]:
        return {"n": len(body["pixels"])}

    with serving(app, timeout_keep_alive=0.3) as (url, _, _):
        yield f"{url}/predict"


def test_a_connection_is_reused_while_fresh(quick_closing_server: str) -> None:
    async def go() -> Pool:
        pool = Pool(keepalive_expiry_s=10)
        for _ in range(3):
            assert await pool.post_json(quick_closing_server, {"pixels": [1.0]}, 5) == (
                200,
                {"n": 1},
            )
        pool.close()
        return pool

    assert asyncio.run(go()).opened == 1


def test_a_connection_the_server_closed_is_retried_on_a_fresh_one(
    quick_closing_server: str,
) -> None:
    """The client keeps its connection longer than the server does (expiry 10 s against 0.3 s):
    the request written to the closed connection gets nothing back, and is sent again."""

    async def go() -> tuple[Pool, tuple[int, object]]:
        pool = Pool(keepalive_expiry_s=10)
        await pool.post_json(quick_closing_server, {"pixels": [1.0]}, 5)
        await asyncio.sleep(0.8)  # the server has closed its side by now
        answer = await pool.post_json(quick_closing_server, {"pixels": [1.0, 2.0]}, 5)
        pool.close()
        return pool, answer

    pool, answer = asyncio.run(go())
    assert answer == (200, {"n": 2})
    assert pool.opened == 2


def test_an_idle_connection_past_the_expiry_is_not_reused(quick_closing_server: str) -> None:
    async def go() -> Pool:
        pool = Pool(keepalive_expiry_s=0.1)
        await pool.post_json(quick_closing_server, {"pixels": [1.0]}, 5)
        await asyncio.sleep(0.2)
        assert await pool.post_json(quick_closing_server, {"pixels": [1.0]}, 5) == (200, {"n": 1})
        pool.close()
        return pool

    assert asyncio.run(go()).opened == 2


def test_a_refused_connection_is_a_wire_error_named_by_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/predict"

    async def go() -> None:
        await Pool().post_json(url, {"pixels": [1.0]}, 5)

    with pytest.raises(WireError, match=url):
        asyncio.run(go())
