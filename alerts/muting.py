"""Silences and inhibit rules: which firing alerts the receivers do not hear about (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from tuneloop.regex import fullmatch
from tuneloop.storage.timeseries.matchers import parse_matcher
from tuneloop.storage.timeseries.types import Matcher, MatchOp

LabelSet = Mapping[str, str]


@lru_cache(maxsize=4096)
def matcher(text: str) -> Matcher:
    return parse_matcher(text)


def matches(matchers: Sequence[Matcher], labels: LabelSet) -> bool:
    """Every matcher holds (a missing label is the empty string; regexes are RE2, anchored,
    so a silence's pattern is linear in the label value)."""
    for item in matchers:
        value = labels.get(item.name, "")
        op = MatchOp(item.op)
        if op is MatchOp.EQ:
            ok = value == item.value
        elif op is MatchOp.NE:
            ok = value != item.value
        else:
            found = fullmatch(item.value, value)
            ok = found if op is MatchOp.RE else not found
        if not ok:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Silence:
    id: int
    matchers: tuple[Matcher, ...]
    starts_at: datetime
    ends_at: datetime

    def active(self, now: datetime) -> bool:
        return self.starts_at <= now < self.ends_at


@dataclass(frozen=True, slots=True)
class Inhibition:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]


def silenced_by(labels: LabelSet, silences: Sequence[Silence], now: datetime) -> int | None:
    for silence in silences:
        if silence.active(now) and matches(silence.matchers, labels):
            return silence.id
    return None


class InhibitIndex:
    """The firing alerts that match each inhibit rule's source, by their ``equal`` label
    values: whether an alert is inhibited is then one lookup per rule, not a scan of every
    firing alert (a fleet-wide incident fires hundreds at once)."""

    def __init__(self, firing: Sequence[LabelSet], inhibitions: Sequence[Inhibition]) -> None:
        self._rules: list[tuple[Inhibition, dict[tuple[str, ...], set[tuple[str, ...]]]]] = []
        for rule in inhibitions:
            sources: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
            for labels in firing:
                if matches(rule.source, labels):
                    sources.setdefault(_equal_key(rule, labels), set()).add(_identity(labels))
            if sources:
                self._rules.append((rule, sources))

    def inhibits(self, labels: LabelSet) -> bool:
        """Whether a firing alert other than this one matches a rule's source and has the same
        ``equal`` labels as this alert, which matches the rule's target."""
        own = _identity(labels)
        for rule, sources in self._rules:
            found = sources.get(_equal_key(rule, labels))
            if found and (len(found) > 1 or own not in found) and matches(rule.target, labels):
                return True
        return False


def _equal_key(rule: Inhibition, labels: LabelSet) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in rule.equal)


def _identity(labels: LabelSet) -> tuple[str, ...]:
    return tuple(f"{key}\x00{value}" for key, value in sorted(labels.items()))


def mute_reason(
    labels: LabelSet, *, silences: Sequence[Silence], inhibit: InhibitIndex, now: datetime
) -> str | None:
    """``silence:<id>``, ``inhibited`` or ``None``."""
    silence = silenced_by(labels, silences, now)
    if silence is not None:
        return f"silence:{silence}"
    if inhibit.inhibits(labels):
        return "inhibited"
    return None
