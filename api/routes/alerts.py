"""Alerting of a project: rules, alerts, silences, receivers, inhibit rules and notifications,
under ``/api/v1/projects/{project}/alerts``.

Every role of the project may read; agents (collectors, job agents) may not change anything.
A rule is checked when it is written: an invalid query, an unknown metric or a broken template
is refused with the reason (422). A receiver's target is where the server sends requests, so
only an admin adds one, and one outside the public internet is refused (422) unless the
operator allows its network (``TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status

from alerts import store
from alerts.rules import InhibitDefinition, RuleDefinition, parse_rule_file
from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    CurrentToken,
    PageDep,
    PathId,
    ProjectDep,
    RuntimeDep,
    SessionDep,
    require,
    require_member,
)
from api.schemas.alerts import (
    AlertOut,
    InhibitionCreate,
    InhibitionOut,
    NotificationOut,
    ReceiverCreate,
    ReceiverOut,
    RuleFileIn,
    RuleFileOut,
    RuleOut,
    SilenceCreate,
    SilenceOut,
)
from api.schemas.common import Page
from tuneloop import accounts
from tuneloop.storage.models import (
    AlertInhibition,
    AlertInstance,
    ApiToken,
)
from tuneloop.storage.types import utcnow

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}/alerts", tags=["alerts"], responses=AUTH_ERRORS
)

RuleName = Annotated[str, Path(description="Rule name (the alertname)")]


ADMIN_FOR_RECEIVERS = (
    "choosing a receiver's target needs an admin token: the server sends requests to it "
    "(create one on the server: tuneloop token create --role admin)"
)


def _writer(token: ApiToken) -> None:
    require_member(token, "changing alert rules or receivers")


# --------------------------------------------------------------------------- rules


@router.post("/rules", status_code=status.HTTP_201_CREATED, summary="Create an alert rule")
def create_rule(
    body: RuleDefinition,
    project: ProjectDep,
    session: SessionDep,
    token: CurrentToken,
    runtime: RuntimeDep,
) -> RuleOut:
    _writer(token)
    actor = accounts.actor_name(token)
    row = store.create_rule(session, project, body, actor=actor, series=runtime.remote_series)
    return RuleOut.of(row)


@router.get("/rules", summary="List a project's alert rules")
def list_rules(
    project: ProjectDep, session: SessionDep, _token: CurrentToken, page: PageDep
) -> Page[RuleOut]:
    rows = store.list_rules(session, project, limit=page.fetch, offset=page.offset)
    return page.build(rows, RuleOut.of)


@router.get("/rules/{rule}", summary="One alert rule")
def read_rule(rule: RuleName, project: ProjectDep, session: SessionDep) -> RuleOut:
    return RuleOut.of(store.get_rule(session, project, rule))


@router.put("/rules/{rule}", summary="Replace an alert rule")
def replace_rule(
    rule: RuleName,
    body: RuleDefinition,
    project: ProjectDep,
    session: SessionDep,
    token: CurrentToken,
    runtime: RuntimeDep,
) -> RuleOut:
    _writer(token)
    row = store.get_rule(session, project, rule)
    actor = accounts.actor_name(token)
    series = runtime.remote_series
    store.replace_rule(session, project, row, body, source="api", actor=actor, series=series)
    return RuleOut.of(row)


@router.delete("/rules/{rule}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a rule")
def delete_rule(
    rule: RuleName, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> None:
    _writer(token)
    row = store.get_rule(session, project, rule)
    store.delete_rule(session, row, actor=accounts.actor_name(token))


@router.post("/rules:load", summary="Create or update the rules of a YAML rule file")
def load_rules(
    body: RuleFileIn,
    project: ProjectDep,
    session: SessionDep,
    token: CurrentToken,
    runtime: RuntimeDep,
) -> RuleFileOut:
    """All or nothing: one invalid rule refuses the whole file, every problem listed."""
    _writer(token)
    parsed = parse_rule_file(  # RuleError: a 422
        body.text, source=body.source, runbook_base_url=runtime.settings.alerts_runbook_base_url
    )
    outcome = store.load_rule_file(
        session,
        project,
        parsed,
        source=body.source,
        actor=accounts.actor_name(token),
        series=runtime.remote_series,
    )
    return RuleFileOut(**outcome)


# --------------------------------------------------------------------------- alerts


@router.get("", summary="Alerts: pending, firing and recently resolved")
def list_alerts(
    project: ProjectDep,
    session: SessionDep,
    _token: CurrentToken,
    state: Annotated[str | None, Query(pattern="^(pending|firing|resolved)$")] = None,
) -> list[AlertOut]:
    return [
        AlertOut.model_validate({**_columns(instance), "rule": name})
        for instance, name in store.list_alerts(session, project, state=state)
    ]


def _columns(instance: AlertInstance) -> dict[str, Any]:
    return {
        column: getattr(instance, column) for column in AlertOut.model_fields if column != "rule"
    }


# --------------------------------------------------------------------------- silences


@router.post("/silences", status_code=status.HTTP_201_CREATED, summary="Silence alerts")
def create_silence(
    body: SilenceCreate, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> SilenceOut:
    """Alerts matching every matcher are kept from the receivers from ``starts_at`` (default
    now) to ``ends_at`` (or for ``duration``); they still show as firing here."""
    _writer(token)
    starts_at, ends_at = store.silence_window(body.starts_at, body.ends_at, body.duration, utcnow())
    row = store.create_silence(
        session,
        project,
        matchers=body.matchers,
        starts_at=starts_at,
        ends_at=ends_at,
        created_by=accounts.actor_name(token),
        comment=body.comment,
    )
    return SilenceOut.model_validate(row)


@router.get("/silences", summary="Silences, active ones only unless all=true")
def list_silences(
    project: ProjectDep,
    session: SessionDep,
    _token: CurrentToken,
    all_: Annotated[bool, Query(alias="all")] = False,
) -> list[SilenceOut]:
    rows = store.list_silences(session, project, active_at=None if all_ else utcnow())
    return [SilenceOut.model_validate(row) for row in rows]


@router.delete(
    "/silences/{silence_id}", status_code=status.HTTP_204_NO_CONTENT, summary="End a silence now"
)
def expire_silence(
    silence_id: PathId, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> None:
    _writer(token)
    row = store.get_silence(session, project, silence_id)
    store.expire_silence(session, row, utcnow(), actor=accounts.actor_name(token))


# --------------------------------------------------------------------------- receivers


@router.post("/receivers", status_code=status.HTTP_201_CREATED, summary="Add a receiver (admin)")
def create_receiver(
    body: ReceiverCreate,
    project: ProjectDep,
    session: SessionDep,
    token: CurrentToken,
    runtime: RuntimeDep,
) -> ReceiverOut:
    """Needs an admin token. Its URL (or mail server) must be a public address, or one in a
    network of ``TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS``; checked again on every send."""
    _writer(token)  # an agent token hears that it may change nothing at all
    require(token.role == "admin", ADMIN_FOR_RECEIVERS)
    row = store.create_receiver(
        session,
        project,
        name=body.name,
        kind=body.kind,
        config=body.config,
        matchers=body.matchers,
        group_by=body.group_by,
        actor=accounts.actor_name(token),
        allowed_networks=runtime.settings.alerts_allowed_target_networks,
    )
    return ReceiverOut.of(row)


@router.get("/receivers", summary="Receivers, with their delivery health")
def list_receivers(
    project: ProjectDep, session: SessionDep, _token: CurrentToken
) -> list[ReceiverOut]:
    return [ReceiverOut.of(row) for row in store.list_receivers(session, project)]


@router.delete(
    "/receivers/{name}", status_code=status.HTTP_204_NO_CONTENT, summary="Remove a receiver"
)
def delete_receiver(
    name: str, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> None:
    _writer(token)
    store.delete_receiver(session, project, name, actor=accounts.actor_name(token))


# --------------------------------------------------------------------------- inhibit rules


def _inhibition_out(row: AlertInhibition) -> InhibitionOut:
    return InhibitionOut(
        id=row.id,
        source=list(row.source_matchers),
        target=list(row.target_matchers),
        equal=list(row.equal),
        origin=row.origin,
    )


@router.post("/inhibitions", status_code=status.HTTP_201_CREATED, summary="Add an inhibit rule")
def create_inhibition(
    body: InhibitionCreate, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> InhibitionOut:
    _writer(token)
    definition = InhibitDefinition(tuple(body.source), tuple(body.target), tuple(body.equal))
    row = store.add_inhibition(session, project, definition, actor=accounts.actor_name(token))
    return _inhibition_out(row)


@router.get("/inhibitions", summary="Inhibit rules")
def list_inhibitions(
    project: ProjectDep, session: SessionDep, _token: CurrentToken
) -> list[InhibitionOut]:
    return [_inhibition_out(row) for row in store.list_inhibitions(session, project)]


@router.delete(
    "/inhibitions/{inhibition_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove an inhibit rule",
)
def delete_inhibition(
    inhibition_id: PathId, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> None:
    _writer(token)
    store.delete_inhibition(session, project, inhibition_id, actor=accounts.actor_name(token))


# --------------------------------------------------------------------------- notifications


@router.get("/notifications", summary="Notifications, newest first, with their outcome")
def list_notifications(
    project: ProjectDep, session: SessionDep, _token: CurrentToken, page: PageDep
) -> Page[NotificationOut]:
    rows = store.list_notifications(session, project, limit=page.fetch, offset=page.offset)
    return page.build(rows, NotificationOut.model_validate)
