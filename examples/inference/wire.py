"""A minimal HTTP/1.1 client for the load generator: keep-alive connections on asyncio streams,
one request at a time each, JSON bodies with ``Content-Length`` (what uvicorn answers).

httpx spends about a millisecond of CPU per request; on a loaded two-core machine that made the
generator, not the server, the bottleneck. This costs a tenth of it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class WireError(OSError):
    """The connection failed or the answer was not HTTP/1.1 with a Content-Length."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Idle keep-alive connections per ``host:port``; a request takes one or opens one."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[Connection]] = {}

    async def post_json(self, url: str, body: Any, timeout_s: float) -> tuple[int, Any]:
        """``(status, decoded JSON body or None)``; raises :class:`WireError` or
        ``TimeoutError``."""
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        payload = json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        idle = self._idle.setdefault((host, port), [])
        connection = idle.pop() if idle else None
        try:
            async with asyncio.timeout(timeout_s):
                if connection is None:
                    connection = Connection(*await asyncio.open_connection(host, port))
                connection.writer.write(head + payload)
                status, data = await _read_response(connection.reader)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            if connection is not None:
                connection.close()
            raise WireError(f"{url}: {type(exc).__name__}: {exc}") from None
        except TimeoutError:
            if connection is not None:
                connection.close()
            raise
        idle.append(connection)
        return status, json.loads(data) if data else None

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


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
