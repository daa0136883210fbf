"""Reachability checks behind ``/healthz``: each one short, timed, and never raising."""

from __future__ import annotations

import time

import redis
from sqlalchemy import Engine

from api.schemas import CheckResult, HealthOut
from tuneloop.storage import DatabaseUnavailable, check_database

REDIS_TIMEOUT_S = 2.0


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def check_db(engine: Engine) -> CheckResult:
    started = time.perf_counter()
    try:
        check_database(engine)
    except DatabaseUnavailable as exc:
        return CheckResult(ok=False, latency_ms=_elapsed_ms(started), error=str(exc))
    return CheckResult(ok=True, latency_ms=_elapsed_ms(started))


def check_redis(url: str | None) -> CheckResult:
    if not url:
        return CheckResult(ok=None)
    started = time.perf_counter()
    client = redis.Redis.from_url(
        url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return CheckResult(ok=False, latency_ms=_elapsed_ms(started), error=first_line)
    finally:
        client.close()
    return CheckResult(ok=True, latency_ms=_elapsed_ms(started))


def check_health(engine: Engine, redis_url: str | None) -> HealthOut:
    checks = {"database": check_db(engine), "redis": check_redis(redis_url)}
    healthy = all(check.ok is not False for check in checks.values())
    return HealthOut(status="ok" if healthy else "degraded", checks=checks)
