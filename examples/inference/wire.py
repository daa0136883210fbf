"""A minimal HTTP/1.1 client for the load generator: keep-alive connections on asyncio streams,
one request at a time each, JSON bodies with ``Content-Length`` (what uvicorn answers).

httpx spends about a millisecond of CPU per request; on a loaded two-core machine that made the
generator, not the server, the bottleneck. This costs a tenth of it.

Keep-alive follows the rule every HTTP client keeps (httpx's ``keepalive_expiry``, urllib3's
retry of a reused connection): a server closes a connection idle for its keep-alive timeout
(uvicorn: 5 s), and a request written to it just as it closes gets nothing back. So an idle
connection is dropped here before the server's timeout, and a request whose *reused* connection
closed before any byte of an answer is sent once more on a fresh one (``/predict`` is
idempotent). Without both, a few requests a minute failed 1-5 ms after being sent, at the same
moments of the arrival schedule whatever the server's config.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import suppress
from typing import Any
from urllib.parse import urlsplit

KEEPALIVE_EXPIRY_S = 4.0
"""An idle connection older than this is closed rather than reused: below uvicorn's default 5 s
``timeout_keep_alive`` (the example's server sets 15 s)."""


class WireError(OSError):
    """The connection failed or the answer was not HTTP/1.1 with a Content-Length."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Idle keep-alive connections per ``host:port``; a request takes one or opens one."""

    def __init__(self, keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S) -> None:
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._expiry_s = keepalive_expiry_s
        self.opened = 0
        """Connections opened so far (what a test or a report reads)."""

    async def post_json(self, url: str, body: Any, timeout_s: float) -> tuple[int, Any]:
        """``(status, decoded JSON body or None)``; raises :class:`WireError` or
        ``TimeoutError``."""
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        payload = json.dumps(body, separators=(",", ":")).encode()
        request = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        idle = self._idle.setdefault((host, port), [])
        async with asyncio.timeout(timeout_s):
            connection = self._take_idle(idle)
            answer = None
            if connection is not None:
                # Closed by the server while idle: once more, on a fresh connection.
                with suppress(_ClosedUnanswered):
                    answer = await self._exchange(url, connection, request)
            if connection is None or answer is None:
                connection = await self._open(url, host, port)
                try:
                    answer = await self._exchange(url, connection, request)
                except _ClosedUnanswered as exc:
                    raise WireError(f"{url}: the connection closed without an answer") from exc
        idle.append(connection)
        status, data = answer
        return status, json.loads(data) if data else None

    def _take_idle(self, idle: list[Connection]) -> Connection | None:
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to be closed
            if now - connection.idle_since < self._expiry_s:
                return connection
            connection.close()
        return None

    async def _open(self, url: str, host: str, port: int) -> Connection:
        try:
            connection = Connection(*await asyncio.open_connection(host, port))
        except OSError as exc:
            raise WireError(f"{url}: {type(exc).__name__}: {exc}") from None
        self.opened += 1
        return connection

    async def _exchange(
        self, url: str, connection: Connection, request: bytes
    ) -> tuple[int, bytes]:
        """One request and its answer; the connection is closed on any failure."""
        try:
            connection.writer.write(request)
            answer = await _read_response(connection.reader)
        except asyncio.IncompleteReadError as exc:
            connection.close()
            if not exc.partial:
                raise _ClosedUnanswered from None
            raise WireError(f"{url}: the answer broke off after {len(exc.partial)} bytes") from None
        except (ConnectionResetError, BrokenPipeError):
            connection.close()
            raise _ClosedUnanswered from None
        except (OSError, ValueError) as exc:
            connection.close()
            raise WireError(f"{url}: {type(exc).__name__}: {exc}") from None
        except BaseException:  # a timeout or a cancel: the connection is mid-request
            connection.close()
            raise
        connection.idle_since = time.monotonic()
        return answer

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


class _ClosedUnanswered(Exception):
    """The peer closed the connection before any byte of an answer."""


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = await reader.readuntil(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length is None:
        raise ValueError("no Content-Length in the answer")
    return status, await reader.readexactly(length)
