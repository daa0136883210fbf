"""Silences and inhibit rules: which firing alerts the receivers do not hear about (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from api.query_params import parse_matcher
from tuneloop.storage.timeseries.types import Matcher, MatchOp

LabelSet = Mapping[str, str]


@lru_cache(maxsize=4096)
def matcher(text: str) -> Matcher:
    return parse_matcher(text)


@lru_cache(maxsize=4096)
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def matches(matchers: Sequence[Matcher], labels: LabelSet) -> bool:
    """Every matcher holds (a missing label is the empty string; regexes are anchored)."""
    for item in matchers:
        value = labels.get(item.name, "")
        op = MatchOp(item.op)
        if op is MatchOp.EQ:
            ok = value == item.value
        elif op is MatchOp.NE:
            ok = value != item.value
        else:
            found = _pattern(item.value).fullmatch(value) is not None
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


def inhibited(
    labels: LabelSet, firing: Sequence[LabelSet], inhibitions: Sequence[Inhibition]
) -> bool:
    """Whether a firing alert other than this one, matching an inhibit rule's source, has the
    same ``equal`` labels as this alert, which matches the rule's target."""
    for rule in inhibitions:
        if not matches(rule.target, labels):
            continue
        for source in firing:
            if source is labels or source == labels:
                continue
            if matches(rule.source, source) and all(
                source.get(name, "") == labels.get(name, "") for name in rule.equal
            ):
                return True
    return False


def mute_reason(
    labels: LabelSet,
    *,
    silences: Sequence[Silence],
    firing: Sequence[LabelSet],
    inhibitions: Sequence[Inhibition],
    now: datetime,
) -> str | None:
    """``silence:<id>``, ``inhibited`` or ``None``."""
    silence = silenced_by(labels, silences, now)
    if silence is not None:
        return f"silence:{silence}"
    if inhibited(labels, firing, inhibitions):
        return "inhibited"
    return None
