"""Request and response bodies of the alerting routes (``/api/v1/projects/{project}/alerts``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from alerts.notifiers.config import ReceiverKind, redacted
from alerts.rules import RuleDefinition
from alerts.store import definition
from tuneloop.storage.models import AlertReceiver, AlertRule


class RuleOut(BaseModel):
    rule: RuleDefinition
    source: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: AlertRule) -> RuleOut:
        return cls(
            rule=definition(row),
            source=row.source,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class RuleFileIn(BaseModel):
    text: str = Field(description="A rule file in YAML: rules and optional inhibit_rules")
    source: str = Field(
        default="api-file",
        max_length=200,
        description="Rules from an earlier load of the "
        "same source that the file no longer has are deleted",
    )


class RuleFileOut(BaseModel):
    created: list[str]
    updated: list[str]
    unchanged: list[str]
    deleted: list[str]


class AlertOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    rule: str
    fingerprint: str
    labels: dict[str, Any]
    annotations: dict[str, Any]
    state: str
    value: float | None
    active_at: datetime | None
    fired_at: datetime | None
    resolved_at: datetime | None
    muted_by: str | None


class SilenceCreate(BaseModel):
    matchers: list[str] = Field(
        min_length=1, examples=[['alertname="GpuXidError"', 'Hostname="n1"']]
    )
    starts_at: AwareDatetime | None = Field(default=None, description="Default: now")
    ends_at: AwareDatetime | None = None
    duration: str | None = Field(default=None, description="Instead of ends_at: 2h, 30m, ...")
    comment: str = Field(default="", max_length=2000)


class SilenceOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    matchers: list[str]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str


class ReceiverCreate(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    kind: ReceiverKind
    config: dict[str, Any]
    matchers: list[str] = Field(
        default_factory=list, description="Only alerts matching all of these (default: all)"
    )
    group_by: list[str] = Field(default_factory=lambda: ["alertname"])


class ReceiverOut(BaseModel):
    name: str
    kind: str
    config: dict[str, Any]
    matchers: list[str]
    group_by: list[str]
    enabled: bool
    consecutive_failures: int
    last_success_at: datetime | None
    last_failure_at: datetime | None
    last_error: str | None

    @classmethod
    def of(cls, row: AlertReceiver) -> ReceiverOut:
        return cls(
            name=row.name,
            kind=row.kind,
            config=redacted(row.config),
            matchers=list(row.matchers),
            group_by=list(row.group_by),
            enabled=row.enabled,
            consecutive_failures=row.consecutive_failures,
            last_success_at=row.last_success_at,
            last_failure_at=row.last_failure_at,
            last_error=row.last_error,
        )


class InhibitionCreate(BaseModel):
    source: list[str] = Field(min_length=1, examples=[['alertname="GpuNodeDown"']])
    target: list[str] = Field(min_length=1, examples=[['gpu=~".+"']])
    equal: list[str] = Field(default_factory=list, examples=[["Hostname"]])


class InhibitionOut(BaseModel):
    id: int
    source: list[str]
    target: list[str]
    equal: list[str]
    origin: str


class NotificationOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    receiver: str
    event: str
    status: str
    attempts: int
    last_error: str | None
    response_code: int | None
    created_at: datetime
    sent_at: datetime | None
    alert: dict[str, Any]
