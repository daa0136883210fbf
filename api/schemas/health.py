"""The body of ``GET /health``."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class CheckOut(BaseModel):
    ok: bool | None = Field(description="None when the dependency is not configured")
    latency_ms: float | None = None
    error: str | None = None


class CollectorCheckOut(BaseModel):
    """One source of a collector running in this process (host, GPUs, exporters)."""

    ok: bool | None = Field(description="None until its first poll")
    last_error: str | None = None
    last_success_at: datetime | None = None
    consecutive_failures: int = 0


class NotifierCheckOut(BaseModel):
    """One alert receiver (``project/receiver``): failing after 3 failed attempts in a row."""

    ok: bool
    kind: str
    consecutive_failures: int
    last_success_at: datetime | None = None
    last_error: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    checks: dict[str, CheckOut]
    collectors: dict[str, CollectorCheckOut] = Field(
        default_factory=dict,
        description="Sources polled by this process; a failing one makes the status "
        "degraded but never the response 503",
    )
    receivers_failing: int = Field(
        default=0,
        description="Alert receivers of every project that keep failing; one makes the "
        "status degraded but never the response 503",
    )
    notifiers: dict[str, NotifierCheckOut] = Field(
        default_factory=dict,
        description="Alert receivers by project/receiver, with their last error: only those "
        "of the token's project (every project's for an admin token), none without a token",
    )
