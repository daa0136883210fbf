"""Times and durations as Prometheus spells them: ``2024-03-01T12:00:00Z`` or Unix seconds;
``30s``, ``5m``, ``1h30m`` or plain seconds.

Shared by the series API's parameters (``start``, ``end``, ``step``, ``window``) and alert
rules (``for``, ``window``, silences' ``duration``). Errors are ``ValueError`` with a message
written for the person who typed the value.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from tuneloop.storage.types import from_micros

MAX_DURATION_S = 365 * 86_400
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""Times outside stay far enough from datetime's limits for windows and lookbacks."""

_UNIX_RE = re.compile(r"-?\d+(?:\.\d+)?")
_RFC3339_RE = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)
# Prometheus' duration syntax: units from largest to smallest, each at most once.
_DURATION_RE = re.compile(
    r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?"
)
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1_000, 1)


def parse_time(text: str) -> datetime:
    """An RFC 3339 time (``2024-03-01T12:00:00Z``, ``2024-03-01T13:00:00.5+01:00``) or Unix
    seconds (``1709294400``, ``1709294400.25``), as an aware UTC datetime, to the
    microsecond."""
    try:
        value = _time(text)
    except (ValueError, OverflowError, OSError, InvalidOperation):
        raise ValueError(f"{text!r} is not a valid time") from None
    if value is None:
        raise ValueError(
            f"expected an RFC 3339 time (2024-03-01T12:00:00Z) or Unix seconds, got {text!r}"
        )
    if not EARLIEST <= value < LATEST:
        raise ValueError(f"{text!r} is not between {EARLIEST.year} and {LATEST.year}")
    return value


def _time(text: str) -> datetime | None:
    if _UNIX_RE.fullmatch(text):
        if len(text) > 30:
            raise ValueError("too long")
        return from_micros(int((Decimal(text) * 1_000_000).to_integral_value()))
    found = _RFC3339_RE.fullmatch(text)
    if found is None:
        return None
    date, clock, fraction, offset = found.groups()
    zone = "+00:00" if offset in ("Z", "z") else offset
    # Up to nanoseconds are accepted, as Prometheus does; datetime keeps microseconds.
    return datetime.fromisoformat(f"{date}T{clock}{(fraction or '')[:7]}{zone}").astimezone(UTC)


def parse_duration(text: str) -> int:
    """A positive whole number of seconds, from seconds (``30``) or a Prometheus duration
    (``30s``, ``5m``, ``1h30m``, ``1d``, ``1500ms`` is not whole, ``2000ms`` is)."""
    seconds = _duration_seconds(text)
    if seconds != seconds.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of seconds")
    return int(seconds)


def parse_duration_ms(text: str) -> int:
    """A positive whole number of milliseconds, from seconds (``15``, ``0.5``) or a Prometheus
    duration (``15s``, ``1m30s``, ``250ms``), as Prometheus' ``step`` and ``timeout`` take."""
    millis = _duration_seconds(text) * 1000
    if millis != millis.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of milliseconds")
    return int(millis)


def _duration_seconds(text: str) -> Decimal:
    if len(text) > 64:
        raise ValueError("a duration may be at most 64 characters long")
    if _UNIX_RE.fullmatch(text) and not text.startswith("-"):
        seconds = Decimal(text)
    else:
        found = _DURATION_RE.fullmatch(text)
        if not text or found is None:
            raise ValueError(
                f"expected seconds or a duration such as 30s, 5m, 1h or 1h30m, got {text!r}"
            )
        millis = sum(int(g) * unit for g, unit in zip(found.groups(), _UNIT_MS, strict=True) if g)
        seconds = Decimal(millis) / 1000
    if not 0 < seconds <= MAX_DURATION_S:
        raise ValueError(f"{text!r} must be more than 0 and at most 365d")
    return seconds
