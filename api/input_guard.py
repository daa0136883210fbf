"""Text no store can hold, refused at the door with 422 before any route sees it.

A NUL character (PostgreSQL's text refuses it) or a lone UTF-16 surrogate (UTF-8 cannot encode
it) anywhere in the path, the query or a JSON body; NaN, Infinity or a number too large for a
float (``1e400``) in a JSON body: JSON has no such numbers, but Python's parser accepts them.
OTLP bodies are left to the collector's own decoder (there ±Inf is data) and only their path
and query are checked.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response

_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")

OTLP_PATHS: Final = ("/v1/",)
"""Path prefixes whose bodies the collector decodes itself."""


class _RefusedNumber(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _RefusedNumber(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise _RefusedNumber(f"{name} is not a JSON number")


def _strings(value: Any) -> Iterator[str]:
    """Every string of a parsed JSON value, keys included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item.keys()
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored, or ``None``."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "contains a NUL character"
    return "contains a lone surrogate (not valid Unicode)"


def json_problem(body: bytes) -> str | None:
    """Why the JSON ``body`` is refused, or ``None`` (malformed JSON is left to the route,
    which reports it in FastAPI's own words)."""
    try:
        value = json.loads(body, parse_float=_finite, parse_constant=_no_constant)
    except _RefusedNumber as exc:
        return str(exc)
    except ValueError:
        return None
    for text in _strings(value):
        problem = text_problem(text)
        if problem is not None:
            return f"a string {problem}"
    return None


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media: bytes = value.split(b";", 1)[0].strip().lower()
            return media.endswith((b"/json", b"+json"))
    return True  # FastAPI reads a body without a content type as JSON


def _request_problem(scope: Scope) -> tuple[str, str] | None:
    """``(where, why)`` for a path or query that cannot be stored."""
    problem = text_problem(scope["path"])
    if problem is not None:
        return "path", problem
    query = scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        problem = text_problem(name) or text_problem(value)
        if problem is not None:
            return "query", f"parameter {name[:64]!r} {problem}"
    return None


async def _read_body(receive: Receive) -> tuple[bytes, list[Message]]:
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks), messages


class InputGuard:
    """Pure ASGI middleware: 422 for a request carrying text the store cannot hold."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        found = _request_problem(scope)
        if found is not None:
            await _refuse(scope, receive, send, *found)
            return
        if not _is_json(scope) or scope["path"].startswith(OTLP_PATHS):
            await self.app(scope, receive, send)
            return
        body, messages = await _read_body(receive)
        problem = json_problem(body) if body else None
        if problem is not None:
            await _refuse(scope, receive, send, "body", problem)
            return

        async def replay() -> Message:
            # The body read above, then whatever the client sends next (a disconnect).
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _refuse(scope: Scope, receive: Receive, send: Send, where: str, why: str) -> None:
    problem = {"type": "value_error", "loc": [where], "msg": why, "input": None}
    await error_response(422, [problem], "validation_error")(scope, receive, send)
