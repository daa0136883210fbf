"""What every notifier shares: the message it is given, the outcome it reports, and the HTTP
POST whose status decides between done, retry later and give up.

An outcome's error is the status code and a fixed description, never what the receiver
answered: errors are shown through the API, and an answer echoed back would let whoever sets
a receiver read what its target serves.
"""

from __future__ import annotations

import email.utils
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Protocol

import httpx

from alerts.notifiers.config import ReceiverConfig
from alerts.notifiers.targets import TargetRefused

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
    generator_path: str = ""
    """The rule's path in tuneloop's API (``/api/v1/projects/<p>/alerts/rules/<name>``)."""

    def generator_url(self, external_url: str) -> str:
        """Where the alert comes from: the rule in tuneloop's API, else tuneloop itself."""
        return external_url.rstrip("/") + self.generator_path if external_url else ""

    @property
    def dedup_key(self) -> str:
        """The same for every send of this alert's firing and of its resolution, and only for
        them: the alert (instance and fingerprint) and when it started firing, so a re-send
        is recognised and a later firing of the same alert is not taken for one."""
        started = int(self.starts_at.timestamp()) if self.starts_at is not None else 0
        return f"tuneloop/{self.instance_id}/{self.fingerprint[:16]}/{started}"

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
            generator_path=str(alert.get("generatorPath") or ""),
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

    @property
    def idempotency_key(self) -> str:
        """Stable across re-sends of this message: its group and each alert's event."""
        events = sorted(f"{alert.dedup_key}:{alert.event}" for alert in self.alerts)
        text = "\n".join([self.receiver, self.group_key, *events])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def title(self) -> str:
        """``[FIRING:2] GpuHot Hostname=n1``, as Alertmanager's default title."""
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
    except TargetRefused as exc:
        return Outcome("failed", error=str(exc))
    except httpx.TimeoutException:
        return Outcome("retry", error=f"timed out after {timeout_s:g}s")
    except httpx.HTTPError as exc:
        return Outcome("retry", error=f"request failed ({type(exc).__name__})")
    return classify(response)


def status_text(code: int) -> str:
    """``HTTP 503: Service Unavailable``: the code and its standard phrase, nothing of the
    answer's own text."""
    try:
        phrase = HTTPStatus(code).phrase
    except ValueError:
        phrase = "non-standard status"
    return f"HTTP {code}: {phrase}"


def classify(response: httpx.Response) -> Outcome:
    code = response.status_code
    if 200 <= code < 300:
        return Outcome.sent(code)
    error = status_text(code)
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
