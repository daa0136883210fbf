"""Receiver configurations, one model per kind, validated when a receiver is created."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ReceiverKind = Literal["webhook", "slack", "pagerduty", "email"]

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SECRET_FIELDS = frozenset({"url", "routing_key", "password", "bearer_token"})
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


class WebhookConfig(_Config):
    url: str
    bearer_token: str | None = None
    max_alerts: int = Field(default=0, ge=0)
    """At most this many alerts per message (0: all), as Alertmanager's ``max_alerts``."""

    _url = field_validator("url")(_http_url)


class SlackConfig(_Config):
    url: str
    channel: str | None = None
    username: str | None = None

    _url = field_validator("url")(_http_url)


class PagerDutyConfig(_Config):
    routing_key: str = Field(min_length=1, max_length=64)
    url: str = PAGERDUTY_EVENTS_URL
    client: str = "tuneloop"
    client_url: str | None = None

    _url = field_validator("url")(_http_url)


class EmailConfig(_Config):
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


ReceiverConfig = WebhookConfig | SlackConfig | PagerDutyConfig | EmailConfig

_MODELS: dict[str, type[_Config]] = {
    "webhook": WebhookConfig,
    "slack": SlackConfig,
    "pagerduty": PagerDutyConfig,
    "email": EmailConfig,
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
    assert isinstance(config, WebhookConfig | SlackConfig | PagerDutyConfig | EmailConfig)
    return config


def redacted(config: dict[str, Any]) -> dict[str, Any]:
    return {
        key: "***" if key in SECRET_FIELDS and value else value for key, value in config.items()
    }
