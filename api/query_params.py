"""Parsers of the series API's query parameters: PromQL label matchers, times and durations.

Plain functions of one string each; every one raises ``ValueError`` with a message written for
the caller, which the routes turn into a 422. A parsed value is only ever data: matchers reach
SQL as bound parameters, never as SQL text.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from tuneloop.storage.timeseries.types import Matcher, MatchOp
from tuneloop.storage.types import from_micros

MAX_MATCHER_LENGTH = 4096
MAX_DURATION_S = 365 * 86_400
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""Times outside stay far enough from datetime's limits for windows and lookbacks."""

_OPS = ("=~", "!~", "!=", "=")
"""Longest first, so ``=~`` is not read as ``=`` followed by a stray ``~``."""
_LABEL_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUOTES = "\"'`"
_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", "'": "'", '"': '"',
}  # fmt: skip
_HEX_ESCAPE_DIGITS = {"x": 2, "u": 4, "U": 8}
_OCTAL = "01234567"

_UNIX_RE = re.compile(r"-?\d+(?:\.\d+)?")
_RFC3339_RE = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)
# Prometheus' duration syntax: units from largest to smallest, each at most once.
_DURATION_RE = re.compile(
    r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?"
)
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1_000, 1)


# --------------------------------------------------------------------------- matchers


def parse_matcher(text: str) -> Matcher:
    """One PromQL label matcher: ``name op "value"`` with ``op`` one of ``=``, ``!=``, ``=~``,
    ``!~``. The value is a PromQL string: in double or single quotes with Go escapes, or in
    backticks, raw. A label name that is not an identifier (``k8s.pod``) may be quoted too, as
    in Prometheus 3. Regular expressions must compile and are anchored at both ends."""
    if len(text) > MAX_MATCHER_LENGTH:
        raise ValueError(f"a matcher may be at most {MAX_MATCHER_LENGTH} characters long")
    pos = _skip_space(text, 0)
    name, pos = _label_name(text, pos)
    pos = _skip_space(text, pos)
    op = next((op for op in _OPS if text.startswith(op, pos)), None)
    if op is None:
        raise ValueError(f"expected one of =, !=, =~, !~ after label name {name!r} in {text!r}")
    pos = _skip_space(text, pos + len(op))
    if pos >= len(text) or text[pos] not in _QUOTES:
        raise ValueError(f'the value in {text!r} must be a quoted string, as in {name}{op}"value"')
    value, pos = _string(text, pos)
    if _skip_space(text, pos) != len(text):
        raise ValueError(
            f"unexpected {text[pos:]!r} after the value in {text!r}: give one matcher per match"
        )
    matcher = Matcher(name, MatchOp(op), value)
    if matcher.op in (MatchOp.RE, MatchOp.NRE):
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
    return matcher


def _label_name(text: str, pos: int) -> tuple[str, int]:
    if pos < len(text) and text[pos] in _QUOTES:
        name, end = _string(text, pos)
        if not name:
            raise ValueError(f"empty label name in {text!r}")
        return name, end
    found = _LABEL_NAME_RE.match(text, pos)
    if found is None:
        raise ValueError(f'expected a label name at the start of {text!r}, as in gpu="0"')
    return found.group(), found.end()


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


def _string(text: str, pos: int) -> tuple[str, int]:
    """The PromQL string literal starting at ``text[pos]`` and the position after it.

    Go semantics: ``\\x`` and octal escapes are bytes, so the text is assembled as UTF-8 and
    must decode as UTF-8 at the end (label values are UTF-8)."""
    quote = text[pos]
    pos += 1
    if quote == "`":
        end = text.find("`", pos)
        if end < 0:
            raise ValueError(f"unterminated raw string in {text!r}")
        return text[pos:end], end + 1
    out = bytearray()
    while pos < len(text):
        char = text[pos]
        if char == quote:
            try:
                return out.decode(), pos + 1
            except UnicodeDecodeError:
                raise ValueError(f"escapes in {text!r} do not form valid UTF-8") from None
        if char == "\n":
            raise ValueError(f"newline in a quoted string in {text!r}: write \\n")
        if char == "\\":
            pos = _escape(text, pos + 1, out)
        else:
            out += char.encode()
            pos += 1
    raise ValueError(f"unterminated string in {text!r}: missing closing {quote}")


def _escape(text: str, pos: int, out: bytearray) -> int:
    """Append the escape after a backslash at ``text[pos]``; return the position after it."""
    if pos >= len(text):
        raise ValueError(f"unterminated string in {text!r}")
    kind = text[pos]
    if kind in _ESCAPES:
        out += _ESCAPES[kind].encode()
        return pos + 1
    if kind in _OCTAL:
        digits = text[pos : pos + 3]
        if len(digits) != 3 or any(d not in _OCTAL for d in digits) or int(digits, 8) > 255:
            raise ValueError(f"invalid octal escape \\{digits} in {text!r}")
        out.append(int(digits, 8))
        return pos + 3
    if kind in _HEX_ESCAPE_DIGITS:
        size = _HEX_ESCAPE_DIGITS[kind]
        digits = text[pos + 1 : pos + 1 + size]
        if len(digits) != size or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise ValueError(f"\\{kind} needs {size} hex digits in {text!r}")
        code = int(digits, 16)
        if kind == "x":
            out.append(code)
        elif code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"\\{kind}{digits} is not a Unicode character in {text!r}")
        else:
            out += chr(code).encode()
        return pos + 1 + size
    raise ValueError(f"unknown escape \\{kind} in {text!r}")


# --------------------------------------------------------------------------- times


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
    if seconds != seconds.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of seconds")
    if not 0 < seconds <= MAX_DURATION_S:
        raise ValueError(f"{text!r} must be more than 0 and at most 365d")
    return int(seconds)
