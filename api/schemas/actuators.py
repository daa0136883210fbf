"""Bodies of a job's actuator routes (``api/routes/actuators.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.jobs import HeldOut
from tuneloop.storage.types import INTEGER_MAX


class ActuatorOut(BaseModel):
    """A job's actuation policy and the reconcile loop's progress."""

    policy: dict[str, Any]
    goal_version: int | None
    released_version: int | None
    last_good_version: int | None
    approved_version: int | None
    changed_at: datetime | None
    conditions: dict[str, Any]
    held: HeldOut | None = Field(
        default=None, description="Why the goal is not released yet; null when nothing waits"
    )


class ApproveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=INTEGER_MAX, description="Allow desired versions up to this one")


class ConfigMarkOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    version: int
    config: dict[str, Any]
    verdict: str
    reason: str
    evidence: dict[str, Any]
    created_at: datetime
