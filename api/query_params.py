"""Query parameters of the series API: the core's parsers applied to the text, and what they
reject turned into a 422 that names the parameter.

The parsing itself (PromQL matchers, times, durations) lives in the time-series layer, where
alert rules and silences use it too; only the HTTP error shape is here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

from fastapi.exceptions import RequestValidationError

from tuneloop.storage.timeseries.matchers import parse_matcher
from tuneloop.storage.timeseries.times import parse_duration, parse_time
from tuneloop.storage.timeseries.types import Matcher

T = TypeVar("T")


def _parsed(parse: Callable[[str], T], text: str, *loc: str | int) -> T:
    """``parse(text)``, or a 422 naming the parameter, in FastAPI's own error shape."""
    try:
        return parse(text)
    except ValueError as exc:
        problem = {"type": "value_error", "loc": ("query", *loc), "msg": str(exc), "input": text}
        raise RequestValidationError([problem]) from None


def matchers_param(texts: Sequence[str], name: str = "match") -> tuple[Matcher, ...]:
    """One matcher per repeated parameter; a 422 names the one that is wrong by its index."""
    return tuple(_parsed(parse_matcher, text, name, i) for i, text in enumerate(texts))


def time_param(text: str, name: str) -> datetime:
    return _parsed(parse_time, text, name)


def duration_param(text: str, name: str) -> int:
    return _parsed(parse_duration, text, name)
