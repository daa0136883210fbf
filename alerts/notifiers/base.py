"""What every notifier shares: the message it is given, the outcome it reports, and the HTTP
POST whose status decides between done, retry later and give up."""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from alerts.notifiers.config import ReceiverConfig

ZERO_TIME = "0001-01-01T00:00:00Z"
"""Go's zero time: Alertmanager's ``endsAt`` of an alert still firing."""


@dataclass(frozen=True, slots=True)
class AlertMessage:
    """One alert of a notification, as it was when its event happened."""

    instance_id: int
    event: str
    """``firing`` or ``resolved``."""
    fingerprint: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime | None
    ends_at: datetime | None
    value: float | None

    @classmethod
    def of(cls, instance_id: int, event: str, alert: Mapping[str, Any]) -> AlertMessage:
        return cls(
            instance_id=instance_id,
            event=event,
            fingerprint=str(alert.get("fingerprint", "")),
            labels=dict(alert.get("labels") or {}),
            annotations=dict(alert.get("annotations") or {}),
            starts_at=_time(alert.get("startsAt")),
            ends_at=_time(alert.get("endsAt")),
            value=alert.get("value"),
        )


def _time(text: object) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) else None


@dataclass(frozen=True, slots=True)
class GroupMessage:
    """The alerts of one group, for one receiver: what one notification carries."""

    receiver: str
    group_key: str
    group_labels: Mapping[str, str]
    alerts: Sequence[AlertMessage]
    external_url: str = ""

    @property
    def status(self) -> str:
        return "firing" if any(alert.event == "firing" for alert in self.alerts) else "resolved"

    @property
    def common_labels(self) -> dict[str, str]:
        return _common([alert.labels for alert in self.alerts])

    @property
    def common_annotations(self) -> dict[str, str]:
        return _common([alert.annotations for alert in self.alerts])

    def title(self) -> str:
        """``[FIRING:2] GpuHot hostname=n1``, as Alertmanager's default title."""
        firing = sum(alert.event == "firing" for alert in self.alerts)
        head = f"[FIRING:{firing}]" if firing else "[RESOLVED]"
        name = self.group_labels.get("alertname") or self.common_labels.get("alertname", "")
        rest = " ".join(f"{k}={v}" for k, v in self.group_labels.items() if k != "alertname")
        return " ".join(part for part in (head, name, rest) if part)


def _common(label_sets: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not label_sets:
        return {}
    first = label_sets[0]
    return {
        key: value
        for key, value in first.items()
        if all(other.get(key) == value for other in label_sets[1:])
    }


def rfc3339(value: datetime | None) -> str:
    if value is None:
        return ZERO_TIME
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Outcome:
    """``sent``, ``retry`` (5xx, 429, timeouts, refused connections) or ``failed`` (any other
    4xx: the request itself is wrong and sending it again cannot help)."""

    status: str
    error: str | None = None
    code: int | None = None
    retry_after_s: float | None = None
    details: list[str] = field(default_factory=list)

    @classmethod
    def sent(cls, code: int | None = None) -> Outcome:
        return cls("sent", code=code)


class Notifier(Protocol):
    def send(self, config: ReceiverConfig, message: GroupMessage) -> Outcome: ...


_RETRYABLE_4XX = frozenset({408, 425, 429})


def post_json(
    client: httpx.Client,
    url: str,
    payload: Any,
    *,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> Outcome:
    try:
        response = client.post(url, json=payload, timeout=timeout_s, headers=dict(headers or {}))
    except httpx.TimeoutException:
        return Outcome("retry", error=f"timed out after {timeout_s:g}s")
    except httpx.HTTPError as exc:
        return Outcome("retry", error=f"{type(exc).__name__}: {exc}"[:500])
    return classify(response)


def classify(response: httpx.Response) -> Outcome:
    code = response.status_code
    if 200 <= code < 300:
        return Outcome.sent(code)
    body = response.text.strip().replace("\n", " ")[:300]
    error = f"HTTP {code}" + (f": {body}" if body else "")
    if code >= 500 or code in _RETRYABLE_4XX:
        return Outcome("retry", error=error, code=code, retry_after_s=_retry_after(response))
    return Outcome("failed", error=error, code=code)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        if when is None:
            return None
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None
