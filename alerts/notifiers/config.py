"""Receiver configurations, one model per kind, validated when a receiver is created."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tuneloop.storage.timeseries.times import parse_duration

ReceiverKind = Literal["webhook", "slack", "pagerduty", "email", "alertmanager"]

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SECRET_FIELDS = frozenset({"url", "routing_key", "password", "bearer_token"})
PUSH_KINDS = frozenset({"alertmanager"})
"""Kinds sent every firing alert again and again (Alertmanager does the grouping, repeating,
silencing and inhibiting); the others get tuneloop's own routing (``alerts.routing``)."""
"""Shown as ``***`` when a receiver is read back (a Slack URL is itself the secret)."""


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(default=10.0, gt=0, le=60)
    max_attempts: int = Field(default=10, ge=1, le=100)
    """Attempts on 5xx, timeouts and refused connections before the notification fails."""

    @property
    def send_timeout_s(self) -> float:
        """The longest one send may take (what a sender's lease must cover)."""
        return self.timeout_s


def _seconds(value: str, *, allow_zero: bool = True) -> int:
    spelled = str(value).strip()
    if allow_zero and spelled in ("0", "0s", "0m", "0h"):
        return 0
    return parse_duration(spelled)


class _Grouped(_Config):
    """Alertmanager's route timers, for the kinds tuneloop routes itself; 0 turns one off."""

    group_wait: str = "0s"
    """How long a new group waits for more alerts before its first message."""
    group_interval: str = "0s"
    """How long after a group's message the next one (new alerts, resolutions) may go out."""
    repeat_interval: str = "0s"
    """How often a still-firing alert is announced again (0: once)."""

    @field_validator("group_wait", "group_interval", "repeat_interval")
    @classmethod
    def _timer(cls, value: str) -> str:
        _seconds(value)
        return str(value)

    @property
    def group_wait_s(self) -> int:
        return _seconds(self.group_wait)

    @property
    def group_interval_s(self) -> int:
        return _seconds(self.group_interval)

    @property
    def repeat_interval_s(self) -> int:
        return _seconds(self.repeat_interval)


class WebhookConfig(_Grouped):
    url: str
    bearer_token: str | None = None
    max_alerts: int = Field(default=0, ge=0)
    """At most this many alerts per message (0: all), as Alertmanager's ``max_alerts``."""

    _url = field_validator("url")(_http_url)


class SlackConfig(_Grouped):
    url: str
    channel: str | None = None
    username: str | None = None

    _url = field_validator("url")(_http_url)


class PagerDutyConfig(_Grouped):
    routing_key: str = Field(min_length=1, max_length=64)
    url: str = PAGERDUTY_EVENTS_URL
    client: str = "tuneloop"
    client_url: str | None = None

    _url = field_validator("url")(_http_url)


class EmailConfig(_Grouped):
    to: list[str] = Field(min_length=1)
    sender: str = Field(alias="from")
    host: str
    port: int = Field(default=25, ge=1, le=65535)
    starttls: bool = False
    username: str | None = None
    password: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("to")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            if "@" not in address:
                raise ValueError(f"{address!r} is not an e-mail address")
        return value


class AlertmanagerConfig(_Config):
    """Alertmanagers to push alerts to (``POST <url>/api/v2/alerts``): every URL gets every
    alert, as Prometheus sends to each Alertmanager of a cluster."""

    urls: list[str] = Field(min_length=1, max_length=10)
    """Base URLs, such as ``http://alertmanager:9093``."""
    username: str | None = None
    password: str | None = None
    """Basic auth, with ``username``."""
    bearer_token: str | None = None
    resend_interval: str = "1m"
    """How often a firing alert is sent again; each send keeps it active for four times this
    (or the evaluation interval, if longer)."""

    @field_validator("urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            # Read back as given: a password in the URL would show.
            if "@" in url.split("://", 1)[-1].split("/", 1)[0]:
                raise ValueError("put credentials in username and password, not in the URL")
        return [_http_url(url).rstrip("/") for url in value]

    @field_validator("resend_interval")
    @classmethod
    def _resend(cls, value: str) -> str:
        _seconds(value, allow_zero=False)
        return str(value)

    @model_validator(mode="after")
    def _auth(self) -> AlertmanagerConfig:
        if (self.username is None) != (self.password is None):
            raise ValueError("basic auth needs both username and password")
        if self.username is not None and self.bearer_token:
            raise ValueError("give basic auth or bearer_token, not both")
        return self

    @property
    def send_timeout_s(self) -> float:
        return self.timeout_s * len(self.urls)  # one request after the other

    @property
    def resend_interval_s(self) -> int:
        return _seconds(self.resend_interval, allow_zero=False)


ReceiverConfig = WebhookConfig | SlackConfig | PagerDutyConfig | EmailConfig | AlertmanagerConfig

_MODELS: dict[str, type[_Config]] = {
    "webhook": WebhookConfig,
    "slack": SlackConfig,
    "pagerduty": PagerDutyConfig,
    "email": EmailConfig,
    "alertmanager": AlertmanagerConfig,
}


def parse_config(kind: str, data: Any) -> ReceiverConfig:
    """The config of a receiver of ``kind``; ``ValueError`` with one line if invalid."""
    model = _MODELS.get(kind)
    if model is None:
        raise ValueError(f"unknown receiver kind {kind!r}: use one of {', '.join(_MODELS)}")
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in error['loc'])}: "
            f"{str(error['msg']).removeprefix('Value error, ')}"
            for error in exc.errors()
        ]
        raise ValueError(f"{kind} receiver: " + "; ".join(problems)) from None
    assert isinstance(
        config, WebhookConfig | SlackConfig | PagerDutyConfig | EmailConfig | AlertmanagerConfig
    )
    return config


def redacted(config: dict[str, Any]) -> dict[str, Any]:
    return {
        key: "***" if key in SECRET_FIELDS and value else value for key, value in config.items()
    }
