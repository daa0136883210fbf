"""Rules, receivers, silences and inhibit rules of a project in the store: plain functions,
the caller commits. Errors are ``tuneloop.errors`` kinds (the API maps them to 404/409/422).

A function that changes something takes the ``actor`` (who asked: a token's
:func:`tuneloop.accounts.actor_name`, or ``"cli"``) and writes the audit entry itself; without
one (the evaluator, a rule file's own rules, tests) nothing is audited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from alerts.muting import matches
from alerts.notifiers.config import parse_config
from alerts.notifiers.targets import IPNetwork, TargetRefused, check_receiver, configured_networks
from alerts.rule_metrics import metric_lookup
from alerts.rules import (
    LABEL_NAME_RE,
    InhibitDefinition,
    RuleDefinition,
    RuleFile,
    check_metrics,
    duration_s,
    from_stored,
)
from tuneloop.accounts import record_audit
from tuneloop.errors import Conflict, InvalidInput, NotFound
from tuneloop.storage.models import (
    AlertInhibition,
    AlertInstance,
    AlertReceiver,
    AlertRule,
    AlertSilence,
    Notification,
    Project,
)
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.matchers import parse_matcher
from tuneloop.storage.timeseries.types import Matcher

MAX_SILENCE = timedelta(days=90)

_Named = TypeVar("_Named", AlertRule, AlertReceiver)
_Numbered = TypeVar("_Numbered", AlertSilence, AlertInhibition)


def _audit(
    session: Session,
    actor: str | None,
    project_id: int,
    action: str,
    target: str,
    details: Mapping[str, Any] | None = None,
) -> None:
    if actor is not None:
        record_audit(
            session,
            actor=actor,
            action=action,
            target=target,
            project_id=project_id,
            details=details,
        )


def _named(session: Session, model: type[_Named], project: Project, name: str) -> _Named | None:
    return session.scalars(
        select(model).where(model.project_id == project.id, model.name == name)
    ).one_or_none()


def _numbered(
    session: Session, model: type[_Numbered], project: Project, row_id: int, what: str
) -> _Numbered:
    row = session.get(model, row_id)
    # Another project's row reads as missing: ids are global, projects must not see each other.
    if row is None or row.project_id != project.id:
        raise NotFound(f"{what} {row_id} not found")
    return row


# --------------------------------------------------------------------------- rules


def check_rule(
    session: Session, project: Project, rule: RuleDefinition, series: TimeSeriesBackend | None
) -> None:
    check_metrics(rule, metric_lookup(session, project.id, series))  # RuleError: invalid input


def definition(row: AlertRule) -> RuleDefinition:
    return from_stored(
        name=row.name,
        kind=row.kind,
        spec=row.spec,
        for_s=row.for_s,
        severity=row.severity,
        labels=row.labels,
        annotations=row.annotations,
        enabled=row.enabled,
    )


def get_rule(session: Session, project: Project, name: str) -> AlertRule:
    row = _named(session, AlertRule, project, name)
    if row is None:
        raise NotFound(f"alert rule {name!r} not found")
    return row


def list_rules(session: Session, project: Project, *, limit: int, offset: int) -> list[AlertRule]:
    statement = (
        select(AlertRule)
        .where(AlertRule.project_id == project.id)
        .order_by(AlertRule.name)
        .limit(limit)
        .offset(offset)
    )
    return list(session.scalars(statement))


def _apply(row: AlertRule, rule: RuleDefinition, source: str) -> None:
    row.kind = rule.kind.value
    row.spec = rule.spec()
    row.for_s = float(rule.for_s)
    row.severity = rule.severity.value
    row.labels = dict(rule.labels)
    row.annotations = dict(rule.annotations)
    row.enabled = rule.enabled
    row.source = source


def create_rule(
    session: Session,
    project: Project,
    rule: RuleDefinition,
    *,
    source: str = "api",
    actor: str | None = None,
    series: TimeSeriesBackend | None = None,
) -> AlertRule:
    check_rule(session, project, rule, series)
    if _named(session, AlertRule, project, rule.name) is not None:
        raise Conflict(f"alert rule {rule.name!r} already exists in project {project.name!r}")
    row = AlertRule(project_id=project.id, name=rule.name)
    _apply(row, rule, source)
    session.add(row)
    session.flush()
    _audit(session, actor, project.id, "alert.rule.create", f"rule:{row.name}", row.spec)
    return row


def replace_rule(
    session: Session,
    project: Project,
    row: AlertRule,
    rule: RuleDefinition,
    *,
    source: str,
    actor: str | None = None,
    series: TimeSeriesBackend | None = None,
) -> bool:
    """Update ``row`` to ``rule``; returns whether anything changed. A changed query or
    condition clears the rule's pending alerts (their ``for`` clock no longer applies);
    firing ones resolve or go on at the next evaluation."""
    if rule.name != row.name:
        raise InvalidInput(f"the rule's name is {row.name!r}; a rename is a delete and a create")
    check_rule(session, project, rule, series)
    before = (row.kind, row.spec, row.for_s, row.severity, row.labels, row.annotations, row.enabled)
    _apply(row, rule, source)
    after = (row.kind, row.spec, row.for_s, row.severity, row.labels, row.annotations, row.enabled)
    if before == after:
        return False
    session.execute(
        delete(AlertInstance).where(
            AlertInstance.rule_id == row.id, AlertInstance.state == "pending"
        )
    )
    _audit(session, actor, project.id, "alert.rule.update", f"rule:{row.name}", row.spec)
    return True


def delete_rule(session: Session, row: AlertRule, *, actor: str | None = None) -> None:
    session.delete(row)
    _audit(session, actor, row.project_id, "alert.rule.delete", f"rule:{row.name}")


def load_rule_file(
    session: Session,
    project: Project,
    parsed: RuleFile,
    *,
    source: str,
    actor: str | None = None,
    series: TimeSeriesBackend | None = None,
) -> dict[str, list[str]]:
    """Create or update every rule of a file and replace the inhibit rules it brought before;
    rules earlier loaded from the same ``source`` and now gone are deleted. All or nothing:
    the first invalid rule raises and the caller rolls back. With ``actor`` (who loaded it)
    the audit log gets the outcome."""
    outcome: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "deleted": []}
    existing = {
        row.name: row
        for row in session.scalars(select(AlertRule).where(AlertRule.project_id == project.id))
    }
    for rule in parsed.rules:
        row = existing.get(rule.name)
        if row is None:
            create_rule(session, project, rule, source=source, series=series)
            outcome["created"].append(rule.name)
        elif replace_rule(session, project, row, rule, source=source, series=series):
            outcome["updated"].append(rule.name)
        else:
            outcome["unchanged"].append(rule.name)
    names = {rule.name for rule in parsed.rules}
    for name, row in existing.items():
        if row.source == source and name not in names:
            session.delete(row)
            outcome["deleted"].append(name)
    session.execute(
        delete(AlertInhibition).where(
            AlertInhibition.project_id == project.id, AlertInhibition.origin == source
        )
    )
    for inhibit in parsed.inhibit_rules:
        add_inhibition(session, project, inhibit, origin=source)
    _audit(session, actor, project.id, "alert.rules.load", f"file:{source}", outcome)
    return outcome


# --------------------------------------------------------------------------- alerts


def list_alerts(
    session: Session, project: Project, *, state: str | None = None
) -> list[tuple[AlertInstance, str]]:
    """The project's alerts (pending, firing, recently resolved) with their rule's name."""
    statement = (
        select(AlertInstance, AlertRule.name)
        .join(AlertRule, AlertRule.id == AlertInstance.rule_id)
        .where(AlertRule.project_id == project.id)
        .order_by(AlertRule.name, AlertInstance.id)
    )
    if state is not None:
        statement = statement.where(AlertInstance.state == state)
    return [(instance, name) for instance, name in session.execute(statement).all()]


def alerts_series(
    session: Session, project: Project, matchers: Sequence[Matcher] = (), *, since: datetime
) -> list[tuple[dict[str, str], datetime]]:
    """Prometheus's ``ALERTS`` of the project: the labels of each pending or firing alert
    evaluated at or after ``since`` (older is stale) with ``alertstate`` added, those
    ``matchers`` select, and when it was last evaluated."""
    found = []
    for row, _ in list_alerts(session, project):
        labels = {**row.labels, "alertstate": row.state}
        evaluated = row.last_eval_at
        fresh = evaluated is not None and evaluated >= since
        if row.state in ("pending", "firing") and fresh and matches(matchers, labels):
            assert evaluated is not None
            found.append((labels, evaluated))
    return found


# --------------------------------------------------------------------------- receivers


def _matchers(texts: Iterable[Any], what: str) -> list[str]:
    checked = []
    for text in texts:
        try:
            parse_matcher(str(text))
        except ValueError as exc:
            raise InvalidInput(f"{what}: {exc}") from None
        checked.append(str(text))
    return checked


def create_receiver(
    session: Session,
    project: Project,
    *,
    name: str,
    kind: str,
    config: dict[str, Any],
    matchers: Sequence[str] = (),
    group_by: Sequence[str] = ("alertname",),
    actor: str | None = None,
    allowed_networks: Sequence[IPNetwork] | None = None,
) -> AlertReceiver:
    """``allowed_networks``: the non-public networks its target may be in (default: the
    settings' ``alerts_allowed_target_networks``)."""
    try:
        parsed = parse_config(kind, config)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    for label in group_by:
        if not LABEL_NAME_RE.fullmatch(label):
            raise InvalidInput(f"invalid label name {label!r} in group_by")
    allowed = configured_networks() if allowed_networks is None else allowed_networks
    try:
        check_receiver(parsed, allowed)
    except TargetRefused as exc:
        raise InvalidInput(f"{kind} receiver: {exc}") from None
    if _named(session, AlertReceiver, project, name) is not None:
        raise Conflict(f"receiver {name!r} already exists in project {project.name!r}")
    row = AlertReceiver(
        project_id=project.id,
        name=name,
        kind=kind,
        config=dict(config),
        matchers=_matchers(matchers, "receiver matchers"),
        group_by=list(group_by),
        enabled=True,
        consecutive_failures=0,
    )
    session.add(row)
    session.flush()
    added = {"kind": row.kind, "matchers": row.matchers, "group_by": row.group_by}
    _audit(session, actor, project.id, "alert.receiver.create", f"receiver:{name}", added)
    return row


def get_receiver(session: Session, project: Project, name: str) -> AlertReceiver:
    row = _named(session, AlertReceiver, project, name)
    if row is None:
        raise NotFound(f"receiver {name!r} not found")
    return row


def delete_receiver(
    session: Session, project: Project, name: str, *, actor: str | None = None
) -> None:
    session.delete(get_receiver(session, project, name))
    _audit(session, actor, project.id, "alert.receiver.delete", f"receiver:{name}")


def list_notifications(
    session: Session, project: Project, *, limit: int, offset: int
) -> list[Notification]:
    """The notifications of the project's receivers, newest first."""
    statement = (
        select(Notification)
        .join(AlertReceiver, AlertReceiver.id == Notification.receiver_id)
        .where(AlertReceiver.project_id == project.id)
        .order_by(Notification.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(session.scalars(statement))


def list_receivers(session: Session, project: Project) -> list[AlertReceiver]:
    return list(
        session.scalars(
            select(AlertReceiver)
            .where(AlertReceiver.project_id == project.id)
            .order_by(AlertReceiver.name)
        )
    )


# --------------------------------------------------------------------------- silences


def silence_window(
    starts_at: datetime | None, ends_at: datetime | None, duration: str | None, now: datetime
) -> tuple[datetime, datetime]:
    """A silence's start (default ``now``) and end (``ends_at``, or ``duration`` after the
    start): silences are time-boxed, so one of the two is needed."""
    start = starts_at or now
    if duration is not None:
        if ends_at is not None:
            raise InvalidInput("give ends_at or duration, not both")
        try:
            ends_at = start + timedelta(seconds=duration_s(duration))
        except ValueError as exc:
            raise InvalidInput(f"duration: {exc}") from None
    if ends_at is None:
        raise InvalidInput("a silence needs ends_at or duration: silences are time-boxed")
    return start, ends_at


def create_silence(
    session: Session,
    project: Project,
    *,
    matchers: Sequence[str],
    starts_at: datetime,
    ends_at: datetime,
    created_by: str,
    comment: str = "",
) -> AlertSilence:
    """Create a silence; ``created_by`` (the actor) also goes to the audit log."""
    if not matchers:
        raise InvalidInput("a silence needs at least one matcher")
    checked = _matchers(matchers, "silence")
    if all(parse_matcher(text).value == "" for text in checked):
        raise InvalidInput("a silence needs a matcher that does not match the empty string")
    if ends_at <= starts_at:
        raise InvalidInput("ends_at must be after starts_at")
    if ends_at - starts_at > MAX_SILENCE:
        raise InvalidInput(f"a silence may last at most {MAX_SILENCE.days} days")
    row = AlertSilence(
        project_id=project.id,
        matchers=checked,
        starts_at=starts_at,
        ends_at=ends_at,
        created_by=created_by,
        comment=comment,
    )
    session.add(row)
    session.flush()
    created = {"matchers": row.matchers, "ends_at": ends_at.isoformat()}
    _audit(session, created_by, project.id, "alert.silence.create", f"silence:{row.id}", created)
    return row


def get_silence(session: Session, project: Project, silence_id: int) -> AlertSilence:
    return _numbered(session, AlertSilence, project, silence_id, "silence")


def list_silences(
    session: Session, project: Project, *, active_at: datetime | None = None
) -> list[AlertSilence]:
    statement = select(AlertSilence).where(AlertSilence.project_id == project.id)
    if active_at is not None:
        statement = statement.where(
            AlertSilence.starts_at <= active_at, AlertSilence.ends_at > active_at
        )
    return list(session.scalars(statement.order_by(AlertSilence.id)))


def expire_silence(
    session: Session, row: AlertSilence, now: datetime, *, actor: str | None = None
) -> None:
    """End a silence now (kept for the record)."""
    if row.ends_at > now:
        row.ends_at = max(now, row.starts_at)
    _audit(session, actor, row.project_id, "alert.silence.expire", f"silence:{row.id}")


# --------------------------------------------------------------------------- inhibit rules


def add_inhibition(
    session: Session,
    project: Project,
    inhibit: InhibitDefinition,
    *,
    origin: str = "api",
    actor: str | None = None,
) -> AlertInhibition:
    row = AlertInhibition(
        project_id=project.id,
        source_matchers=_matchers(inhibit.source, "inhibit source"),
        target_matchers=_matchers(inhibit.target, "inhibit target"),
        equal=list(inhibit.equal),
        origin=origin,
    )
    session.add(row)
    session.flush()
    _audit(session, actor, project.id, "alert.inhibition.create", f"inhibition:{row.id}")
    return row


def list_inhibitions(session: Session, project: Project) -> list[AlertInhibition]:
    return list(
        session.scalars(
            select(AlertInhibition)
            .where(AlertInhibition.project_id == project.id)
            .order_by(AlertInhibition.id)
        )
    )


def get_inhibition(session: Session, project: Project, inhibition_id: int) -> AlertInhibition:
    return _numbered(session, AlertInhibition, project, inhibition_id, "inhibit rule")


def delete_inhibition(
    session: Session, project: Project, inhibition_id: int, *, actor: str | None = None
) -> None:
    session.delete(get_inhibition(session, project, inhibition_id))
    _audit(session, actor, project.id, "alert.inhibition.delete", f"inhibition:{inhibition_id}")
