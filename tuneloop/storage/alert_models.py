"""Alerting tables: rules and their instances, notifications, receivers, silences and inhibit
rules (re-exported by ``tuneloop.storage.models``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from tuneloop.storage.base import Base
from tuneloop.storage.types import BigIntPK, LabelsJSON, utcnow


class AlertRule(Base):
    __tablename__ = "alert_rules"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20))
    """``threshold``, ``rate``, ``absent`` or ``regression``."""
    spec: Mapped[dict[str, Any]] = mapped_column()
    """Query (metric, matchers, aggregation, window) and comparison."""
    for_s: Mapped[float] = mapped_column(Float, default=0.0)
    severity: Mapped[str] = mapped_column(String(20), default="warning")
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(default=dict)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    source: Mapped[str] = mapped_column(String(200), default="api")
    """Where the rule came from: ``api`` or the YAML file it was loaded from."""


class AlertInstance(Base):
    """One label set of one rule, with its state kept so a restart neither drops nor repeats."""

    __tablename__ = "alert_instances"
    __table_args__ = (UniqueConstraint("rule_id", "fingerprint"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rule_id: Mapped[int] = mapped_column(ForeignKey("alert_rules.id", ondelete="CASCADE"))
    fingerprint: Mapped[str] = mapped_column(String(64))
    labels: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[str] = mapped_column(String(20), default="inactive")
    """``inactive``, ``pending``, ``firing`` or ``resolved``."""
    value: Mapped[float | None] = mapped_column(Float, default=None)
    active_at: Mapped[datetime | None] = mapped_column(default=None)
    fired_at: Mapped[datetime | None] = mapped_column(default=None)
    resolved_at: Mapped[datetime | None] = mapped_column(default=None)
    last_eval_at: Mapped[datetime | None] = mapped_column(default=None)
    annotations: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Annotations rendered with the labels and value of the latest evaluation."""
    notified: Mapped[str | None] = mapped_column(String(10), default=None)
    """Last event queued for the receivers (``firing``/``resolved``): what makes a restart
    neither page twice nor forget to say it is over."""
    muted_by: Mapped[str | None] = mapped_column(String(100), default=None)
    """``silence:<id>`` or ``inhibited``, while a firing alert is kept from the receivers."""


class Notification(Base):
    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_status_created", "status", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    instance_id: Mapped[int] = mapped_column(
        ForeignKey("alert_instances.id", ondelete="CASCADE"), index=True
    )
    receiver: Mapped[str] = mapped_column(String(100))
    event: Mapped[str] = mapped_column(String(10))
    """``firing`` or ``resolved``."""
    status: Mapped[str] = mapped_column(String(10), default="pending")
    """``pending``, ``sent`` or ``failed``."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(default=None)
    receiver_id: Mapped[int | None] = mapped_column(
        ForeignKey("alert_receivers.id", ondelete="CASCADE"), default=None, index=True
    )
    group_key: Mapped[str] = mapped_column(String(500), default="")
    """Notifications of one receiver with the same group key go out in one message."""
    alert: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """The alert as it was when the event happened (labels, annotations, times, value)."""
    next_attempt_at: Mapped[datetime | None] = mapped_column(default=None)
    """Not sent before this: the retry backoff, or the lease of the sender that claimed it."""
    response_code: Mapped[int | None] = mapped_column(Integer, default=None)


# --------------------------------------------------------------------------- alerting: receivers,
# silences and inhibit rules (the rules, instances and notifications are above)


class AlertReceiver(Base):
    """Where a project's notifications go: a webhook (Alertmanager payload), Slack,
    PagerDuty or e-mail, for the alerts its matchers select, grouped by ``group_by``."""

    __tablename__ = "alert_receivers"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(20))
    """``webhook``, ``slack``, ``pagerduty``, ``email`` or ``alertmanager``."""
    config: Mapped[dict[str, Any]] = mapped_column()
    matchers: Mapped[list[Any]] = mapped_column(LabelsJSON, default=list)
    group_by: Mapped[list[Any]] = mapped_column(LabelsJSON, default=list)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    """Failed attempts since the last success: a receiver that keeps failing shows here,
    on ``/healthz`` and on ``/metrics``."""
    last_success_at: Mapped[datetime | None] = mapped_column(default=None)
    last_failure_at: Mapped[datetime | None] = mapped_column(default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)


class AlertSilence(Base):
    """Mutes the alerts its matchers all match between ``starts_at`` and ``ends_at``."""

    __tablename__ = "alert_silences"
    __table_args__ = (Index("ix_alert_silences_project_ends", "project_id", "ends_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    matchers: Mapped[list[Any]] = mapped_column(LabelsJSON)
    starts_at: Mapped[datetime] = mapped_column()
    ends_at: Mapped[datetime] = mapped_column()
    created_by: Mapped[str] = mapped_column(String(100))
    comment: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AlertInhibition(Base):
    """While an alert matching ``source`` fires, alerts matching ``target`` with the same
    values of the ``equal`` labels are muted (a node down mutes its GPUs' alerts)."""

    __tablename__ = "alert_inhibitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    source_matchers: Mapped[list[Any]] = mapped_column(LabelsJSON)
    target_matchers: Mapped[list[Any]] = mapped_column(LabelsJSON)
    equal: Mapped[list[Any]] = mapped_column(LabelsJSON, default=list)
    origin: Mapped[str] = mapped_column(String(200), default="api")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
