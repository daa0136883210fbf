"""Reachability checks behind ``/healthz``: each one short, timed, and never raising.

``/healthz`` answers without a token: alert receivers are counted for anyone but named, with
their errors, only to a token of their project (or an admin's)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from alerts.health import ANONYMOUS, EVERY_PROJECT, Audience, failing, receiver_health, visible
from api.schemas.health import CheckOut, CollectorCheckOut, HealthOut, NotifierCheckOut
from collector.status import SourceStatus
from tuneloop.storage import DatabaseUnavailable, check_database
from tuneloop.storage.models import ApiToken

REDIS_TIMEOUT_S = 2.0


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def check_db(engine: Engine) -> CheckOut:
    started = time.perf_counter()
    try:
        check_database(engine)
    except DatabaseUnavailable as exc:
        return CheckOut(ok=False, latency_ms=_elapsed_ms(started), error=str(exc))
    return CheckOut(ok=True, latency_ms=_elapsed_ms(started))


def check_redis(url: str | None) -> CheckOut:
    if not url:
        return CheckOut(ok=None)
    started = time.perf_counter()
    client = redis.Redis.from_url(
        url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return CheckOut(ok=False, latency_ms=_elapsed_ms(started), error=first_line)
    finally:
        client.close()
    return CheckOut(ok=True, latency_ms=_elapsed_ms(started))


def collector_checks(sources: Sequence[SourceStatus]) -> dict[str, CollectorCheckOut]:
    return {
        source.name: CollectorCheckOut(
            ok=source.ok,
            last_error=source.last_error,
            last_success_at=source.last_success_at,
            consecutive_failures=source.consecutive_failures,
        )
        for source in sources
    }


def audience_of(token: ApiToken | None) -> Audience:
    """Whose receivers ``token`` sees by name: an admin's every project's, a project token its
    project's, no token none."""
    if token is None:
        return ANONYMOUS
    if token.role == "admin":
        return EVERY_PROJECT
    return Audience(named=True, project_id=token.project_id)


def notifier_checks(engine: Engine, audience: Audience) -> tuple[dict[str, NotifierCheckOut], int]:
    """The receivers ``audience`` sees, by ``project/receiver``, and how many receivers of
    every project are failing."""
    try:
        health = receiver_health(engine)
    except SQLAlchemyError:  # the database check already says why
        return {}, 0
    shown = {
        f"{item.project}/{item.receiver}": NotifierCheckOut(
            ok=item.ok,
            kind=item.kind,
            consecutive_failures=item.consecutive_failures,
            last_success_at=item.last_success_at,
            last_error=item.last_error,
        )
        for item in visible(health, audience)
    }
    return shown, failing(health)


def check_health(
    engine: Engine,
    redis_url: str | None,
    sources: Sequence[SourceStatus] = (),
    audience: Audience = ANONYMOUS,
) -> HealthOut:
    checks = {"database": check_db(engine), "redis": check_redis(redis_url)}
    collectors = collector_checks(sources)
    notifiers, receivers_failing = (
        notifier_checks(engine, audience) if checks["database"].ok else ({}, 0)
    )
    healthy = (
        all(check.ok is not False for check in checks.values())
        and all(collector.ok is not False for collector in collectors.values())
        and receivers_failing == 0
    )
    return HealthOut(
        status="ok" if healthy else "degraded",
        checks=checks,
        collectors=collectors,
        receivers_failing=receivers_failing,
        notifiers=notifiers,
    )


def dependencies_up(health: HealthOut) -> bool:
    """Whether every configured dependency answers. A failing collector source does not count:
    restarting this process would not bring a GPU or an exporter back, and the samples of the
    other sources and of the receivers still flow."""
    return all(check.ok is not False for check in health.checks.values())
