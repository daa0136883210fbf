"""Times (RFC 3339, Unix seconds) and durations (Prometheus' 5m, 1h30m, seconds)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tuneloop.storage.timeseries.times import parse_duration, parse_duration_ms, parse_time

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1709294400", T0),
        ("1709294400.25", T0.replace(microsecond=250_000)),
        ("1709294400.0000004", T0),
        ("2024-03-01T12:00:00Z", T0),
        ("2024-03-01t12:00:00z", T0),
        ("2024-03-01 13:30:00+01:30", T0),
        ("2024-03-01T12:00:00.123456789Z", T0.replace(microsecond=123_456)),
    ],
)
def test_parse_time(text: str, expected: datetime) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2024-03-01", "expected an RFC 3339 time"),
        ("2024-03-01T12:00:00", "expected an RFC 3339 time"),  # no offset: ambiguous
        ("now", "expected an RFC 3339 time"),
        ("1e9", "expected an RFC 3339 time"),
        ("nan", "expected an RFC 3339 time"),
        ("2024-02-30T00:00:00Z", "not a valid time"),
        ("99999999999999999", "not a valid time"),
        ("0001-01-01T00:00:00Z", "not between 1900 and 9000"),
    ],
)
def test_parse_time_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_time(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30), ("30.0", 30), ("30s", 30), ("5m", 300), ("1h30m", 5400), ("1d", 86400),
     ("1w", 604800), ("2000ms", 2), ("1m30s500ms", None), ("365d", 31_536_000)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: int | None) -> None:
    if seconds is None:
        with pytest.raises(ValueError, match="whole number of seconds"):
            parse_duration(text)
    else:
        assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [("0", "more than 0"), ("0s", "more than 0"), ("-5", "expected seconds or a duration"),
     ("1.5", "whole number"), ("1500ms", "whole number"), ("5m1h", "expected seconds"),
     ("", "expected seconds"), ("m", "expected seconds"), ("30 s", "expected seconds"),
     ("366d", "at most 365d"), ("9" * 100, "at most 64 characters")],
)  # fmt: skip
def test_parse_duration_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "millis"),
    [("15", 15_000), ("0.5", 500), ("250ms", 250), ("1m30s", 90_000), ("1s500ms", 1_500)],
)
def test_parse_duration_ms(text: str, millis: int) -> None:
    assert parse_duration_ms(text) == millis


@pytest.mark.parametrize(
    ("text", "message"),
    [("0.0005", "whole number of milliseconds"), ("0", "more than 0"), ("-1", "expected")],
)
def test_parse_duration_ms_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration_ms(text)
