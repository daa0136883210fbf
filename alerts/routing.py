"""Which receivers hear about an alert, and in which group (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from alerts.muting import matcher, matches
from tuneloop.storage.timeseries.types import Matcher


@dataclass(frozen=True, slots=True)
class Route:
    receiver_id: int
    receiver: str
    matchers: tuple[Matcher, ...]
    group_by: tuple[str, ...]
    group_wait: timedelta = timedelta(0)
    group_interval: timedelta = timedelta(0)
    repeat_interval: timedelta = timedelta(0)
    """Alertmanager's route timers (``alerts.outbox``); zero: off."""

    @classmethod
    def of(
        cls, receiver_id: int, receiver: str, matchers: Sequence[str], group_by: Sequence[str]
    ) -> Route:
        return cls(
            receiver_id, receiver, tuple(matcher(text) for text in matchers), tuple(group_by)
        )


def routes_for(labels: Mapping[str, str], routes: Sequence[Route]) -> list[Route]:
    return [route for route in routes if matches(route.matchers, labels)]


def group_labels(route: Route, labels: Mapping[str, str]) -> dict[str, str]:
    return {name: labels[name] for name in sorted(route.group_by) if labels.get(name)}


def group_key(route: Route, labels: Mapping[str, str]) -> str:
    """Alertmanager's shape: the route's matchers, then the alert's group labels."""
    route_part = ", ".join(f'{m.name}{m.op}"{m.value}"' for m in route.matchers)
    grouped = ", ".join(f'{k}="{v}"' for k, v in group_labels(route, labels).items())
    return f"{{}}/{{{route_part}}}:{{{grouped}}}"
