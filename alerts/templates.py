"""Annotation and label templates, in the subset of Prometheus' template syntax alert rules use.

``{{ $labels.gpu }}``, ``{{ $value }}``, ``{{ $externalLabels.x }}`` are not all of Go's
text/template, but they are what rule packs write, and a template written here renders the same in
Prometheus. Supported inside ``{{ ... }}``: ``$value``, ``$labels.NAME`` (or
``$labels["NAME"]``), ``.Value`` and ``.Labels.NAME`` (their long forms), optionally piped into
``humanize``, ``humanizePercentage``, ``humanizeDuration``, ``printf "FORMAT"``, ``toUpper`` or
``toLower``. Anything else is refused when the rule is created, with the reason.

Pure functions: parsing and rendering never do I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tuneloop.errors import InvalidInput

_ACTION_RE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)
_LABEL_RE = re.compile(
    r"""(?:\$labels|\.Labels)(?:\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*"([^"]*)"\s*\])"""
)
_PRINTF_RE = re.compile(r'printf\s+"((?:[^"\\]|\\.)*)"')
_FUNCTIONS = ("humanizePercentage", "humanizeDuration", "humanize", "toUpper", "toLower")


class TemplateError(InvalidInput):
    """A template that cannot be rendered; the message says where and why."""


@dataclass(frozen=True, slots=True)
class _Action:
    source: str
    """``value`` or ``label``."""
    label: str
    pipes: tuple[str, ...]


def check_template(text: str) -> None:
    """Raise :class:`TemplateError` unless ``text`` is a template this module can render."""
    _parse(text)


def render(text: str, labels: Mapping[str, str], value: float | None) -> str:
    """``text`` with each action replaced by its value (a missing label renders empty)."""
    parts = _parse(text)
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        current: str | float = (
            labels.get(part.label, "") if part.source == "label" else _value(value)
        )
        for pipe in part.pipes:
            current = _apply(pipe, current)
        out.append(_text(current))
    return "".join(out)


def _value(value: float | None) -> float:
    return math.nan if value is None else value


def _parse(text: str) -> list[str | _Action]:
    parts: list[str | _Action] = []
    position = 0
    for found in _ACTION_RE.finditer(text):
        literal = text[position : found.start()]
        _check_literal(literal, text)
        parts.append(literal)
        parts.append(_action(found.group(1), text))
        position = found.end()
    tail = text[position:]
    _check_literal(tail, text)
    parts.append(tail)
    return parts


def _check_literal(literal: str, text: str) -> None:
    if "{{" in literal:
        raise TemplateError(f"unclosed action '{{{{' in template {text!r}")
    if "}}" in literal:
        raise TemplateError(f"unexpected '}}}}' in template {text!r}")


def _action(body: str, text: str) -> _Action:
    pieces = [piece.strip() for piece in body.split("|")]
    head, pipes = pieces[0], pieces[1:]
    if head in ("$value", ".Value"):
        source, label = "value", ""
    else:
        found = _LABEL_RE.fullmatch(head)
        if found is None:
            raise TemplateError(
                f"unknown expression {head!r} in template {text!r}: use $value or $labels.NAME"
            )
        source, label = "label", found.group(1) or found.group(2)
    for pipe in pipes:
        if pipe not in _FUNCTIONS and _PRINTF_RE.fullmatch(pipe) is None:
            raise TemplateError(
                f"unknown function {pipe!r} in template {text!r}: use one of "
                f'{", ".join(_FUNCTIONS)} or printf "FORMAT"'
            )
        if (found_printf := _PRINTF_RE.fullmatch(pipe)) is not None:
            _check_format(found_printf.group(1), text)
    return _Action(source, label, tuple(pipes))


def _check_format(fmt: str, text: str) -> None:
    try:
        _go_format(fmt, 1.0)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"bad printf format {fmt!r} in template {text!r}: {exc}") from None


def _go_format(fmt: str, value: str | float) -> str:
    # Go's %v prints the value as is; the numeric verbs match Python's.
    python = fmt.replace("%v", "%s")
    if python.count("%") - 2 * python.count("%%") != 1:
        raise ValueError("printf takes exactly one verb, for the piped value")
    return python % (value,)


def _apply(pipe: str, current: str | float) -> str | float:
    if pipe == "toUpper":
        return _text(current).upper()
    if pipe == "toLower":
        return _text(current).lower()
    number = _number(current)
    if pipe == "humanize":
        return humanize(number)
    if pipe == "humanizePercentage":
        return humanize(number * 100) + "%"
    if pipe == "humanizeDuration":
        return humanize_duration(number)
    found = _PRINTF_RE.fullmatch(pipe)
    assert found is not None
    try:
        return _go_format(found.group(1).encode().decode("unicode_escape"), current)
    except (TypeError, ValueError):
        return _go_format(found.group(1), _text(current))


def _number(current: str | float) -> float:
    if isinstance(current, float):
        return current
    try:
        return float(current)
    except ValueError:
        return math.nan


def _text(current: str | float) -> str:
    if isinstance(current, str):
        return current
    if math.isnan(current):
        return "NaN"
    if math.isinf(current):
        return "+Inf" if current > 0 else "-Inf"
    return repr(current) if current != int(current) else str(int(current))


def humanize(value: float) -> str:
    """Prometheus' ``humanize``: SI prefixes, four significant digits."""
    if not math.isfinite(value) or value == 0:
        return _text(value)
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.4g}{prefix}"
    for factor, prefix in ((1e-3, "m"), (1e-6, "u"), (1e-9, "n")):
        if abs(value) < factor * 1000 and abs(value) < 1:
            return f"{value / factor:.4g}{prefix}"
    return f"{value:.4g}"


def humanize_duration(seconds: float) -> str:
    """Prometheus' ``humanizeDuration``: ``1d 2h 3m 4s``, or ms/us below a second."""
    if not math.isfinite(seconds):
        return _text(seconds)
    if abs(seconds) < 1:
        if seconds == 0:
            return "0s"
        if abs(seconds) >= 1e-3:
            return f"{seconds * 1e3:.4g}ms"
        return f"{seconds * 1e6:.4g}us"
    sign = "-" if seconds < 0 else ""
    total = abs(seconds)
    days, rest = divmod(int(total), 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, whole = divmod(rest, 60)
    parts = [
        f"{days}d" if days else "",
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
    ]
    parts.append(f"{whole + (total - int(total)):.4g}s")
    return sign + " ".join(part for part in parts if part)
