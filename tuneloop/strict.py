"""Strict configuration: a mapping with a key its reader does not know is refused, in one line
that names where the mapping is, the unknown keys and the known ones, so that a typo in a
policy, a rule or a spec is an error instead of a setting silently ignored."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

DEFAULT_MESSAGE = "{where}unknown {noun} {unknown}; known: {known}"
"""Placeholders: ``where`` (the path and a colon, or nothing), ``noun``, ``names`` (the unknown
keys quoted, comma-separated), ``unknown_joined`` (them bare, comma-separated), ``unknown``
(their sorted list), ``path`` (the path alone), ``known`` (comma-separated)."""


def unknown_keys(data: Mapping[Any, object], known: Collection[str]) -> list[str]:
    """The keys of ``data`` that ``known`` does not hold, sorted."""
    return sorted(str(key) for key in data if key not in known)


def refuse_unknown_keys(
    data: Mapping[Any, object],
    known: Collection[str],
    *,
    error: Callable[[str], Exception],
    where: str = "",
    noun: str = "field(s)",
    message: str = DEFAULT_MESSAGE,
) -> None:
    """Raise ``error`` if ``data`` has a key outside ``known``. ``known`` is listed in its own
    order when it has one (a tuple, a list) and sorted otherwise; ``message`` is for readers
    whose clients already match an older wording."""
    unknown = unknown_keys(data, known)
    if not unknown:
        return
    listed = list(known) if isinstance(known, list | tuple) else sorted(known)
    raise error(
        message.format(
            where=f"{where}: " if where else "",
            path=where,
            noun=noun,
            names=", ".join(map(repr, unknown)),
            unknown=unknown,
            unknown_joined=", ".join(unknown),
            known=", ".join(listed),
        )
    )
