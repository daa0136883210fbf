"""PromQL label matchers, parsed from their text form (``job=~"train.*"``) into :class:`Matcher`.

Shared by everything that takes matchers from people: the series API's ``match`` parameters,
alert rules, silences and inhibit rules. Errors are ``ValueError`` with a message written for
the person who typed the matcher; callers add where it came from (a query parameter, a rule
file). A parsed value is only ever data: matchers reach SQL as bound parameters, never as SQL
text.
"""

from __future__ import annotations

import re

from tuneloop.regex import compile_anchored
from tuneloop.storage.timeseries.types import Matcher, MatchOp

MAX_MATCHER_LENGTH = 4096

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
        compile_anchored(value)  # RE2, as every backend matches it; refused in one line
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
