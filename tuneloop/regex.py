"""Regular expressions that people and agents supply: label matchers (on every backend),
silences, inhibit rules, alert rules, routes and relabel rules all compile here.

They run on RE2, whose matching time is linear in the text, so no pattern can make a
match take exponential time the way Python's backtracking ``re`` can (``(a+)+`` against
``"a" * 40 + "!"``). Semantics are Prometheus 3's: RE2 syntax, anchored at both ends, and
``.`` matches a newline too (``^(?s:pattern)$``), as PostgreSQL's ``~`` does by default, so
both backends select the same series. What RE2 does not have (backreferences, lookarounds,
possessive quantifiers) is refused with one line naming the pattern.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final, Protocol, cast

import re2

from tuneloop.errors import InvalidInput

MAX_PATTERN_LENGTH: Final = 4096
"""Longer than any selector a person writes; bounds compile time and the cache's size."""
MAX_MEMORY_BYTES: Final = 2 << 20
"""RE2's budget per compiled pattern: a larger program is refused, a larger DFA falls back
to RE2's (still linear) NFA. With the cache below that is at most 1 GiB, usually far less."""
_CACHE_SIZE: Final = 512


class RegexMatch(Protocol):
    """What a match offers: groups by number or name (``None`` when a group took no part)."""

    def group(self, index: int | str = 0, /) -> str | None: ...

    def groupdict(self) -> dict[str, str | None]: ...


class Regex(Protocol):
    """A compiled, anchored pattern."""

    @property
    def groups(self) -> int: ...

    def fullmatch(self, text: str) -> RegexMatch | None: ...


class InvalidRegex(InvalidInput):
    """A pattern RE2 does not accept, or one too long; ``str()`` is one line naming it and
    ``reason`` the why alone, for callers that name the pattern their own way."""

    def __init__(self, pattern: str, reason: str, where: str = "") -> None:
        shown = pattern if len(pattern) <= 100 else f"{pattern[:100]}..."
        super().__init__(f"invalid regular expression {shown!r}{where}: {reason}")
        self.pattern = pattern
        self.reason = reason


def compile_anchored(pattern: str) -> Regex:
    """``pattern`` compiled with RE2 and anchored at both ends; :class:`InvalidRegex` if RE2
    refuses it. Compiled patterns are cached, so callers need not keep them."""
    return _compile(pattern)


def fullmatch(pattern: str, text: str) -> bool:
    """Whether all of ``text`` matches ``pattern`` (a missing label is ``""`` to the caller)."""
    regex = _compile(pattern)
    try:
        return regex.fullmatch(text) is not None
    except UnicodeEncodeError:
        # A lone surrogate cannot be UTF-8; RE2 takes the bytes Python would store instead.
        raw = cast(Any, text.encode("utf-8", "surrogatepass"))
        return regex.fullmatch(raw) is not None


def postgres_pattern(pattern: str) -> str:
    """``pattern`` for PostgreSQL's ``~``, after RE2 accepted it, so that both backends take
    the same language: anchored the same way (PostgreSQL's ``.`` already matches newlines)."""
    _compile(pattern)
    return f"^(?:{pattern})$"


@lru_cache(maxsize=_CACHE_SIZE)
def _compile(pattern: str) -> Regex:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidRegex(
            pattern, f"{len(pattern)} characters, more than the {MAX_PATTERN_LENGTH} allowed"
        )
    options = re2.Options()
    options.max_mem = MAX_MEMORY_BYTES
    options.log_errors = False
    try:
        # Alone first, so that "a)|(b" cannot close the anchoring group below.
        re2.compile(pattern, options)
        return cast(Regex, re2.compile(f"(?s:{pattern})", options))
    except re2.error as exc:
        raise InvalidRegex(pattern, _reason(exc)) from None


def _reason(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else exc
    text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
    reason = " ".join(text.split())
    if "perl operator" in reason or "escape" in reason:
        # What Python's re or PCRE has and RE2 refuses: say why it is not a typo.
        reason += " (RE2 syntax: no backreferences or lookarounds)"
    return reason
