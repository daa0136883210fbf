"""Bodies of the job agent protocol (``api/routes/agents.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.jobs import ReleasedConfigOut
from tuneloop.storage.types import INTEGER_MAX


class RankIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0, le=INTEGER_MAX)
    gpu_uuids: list[str] = Field(
        default_factory=list, examples=[["GPU-5c4ec6a1-3b2f-8e2d-7f0a-1b2c3d4e5f60"]]
    )
    host: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="The host the rank runs on; default: the agent's",
    )


class AgentCreate(BaseModel):
    """What a job's agent reports when it starts."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, max_length=255, examples=["gpu-node-7"])
    pid: int | None = Field(default=None, ge=0, le=INTEGER_MAX)
    world_size: int = Field(ge=1, le=INTEGER_MAX, examples=[8])
    ranks: list[RankIn] = Field(description="The ranks this agent speaks for, with their GPUs")
    config: dict[str, Any] | None = Field(
        default=None,
        description="The config the job started with: becomes desired version 1 (released "
        "and good) when the job has no released version yet, so a rollback can return to it",
    )
    details: dict[str, Any] = Field(default_factory=dict, examples=[{"framework": "torch"}])
    knobs: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The job's own knobs a study may search, applied by the agent at a step "
        "boundary: each an int (low, high, log, powers_of_two) or a categorical (choices) "
        "parameter with the job's default (docs/agent.md, 'Knobs')",
        examples=[[{"name": "loader_workers", "type": "int", "low": 0, "high": 8, "default": 0}]],
    )


class RankOut(BaseModel):
    rank: int
    gpu_uuids: list[str]
    host: str | None = Field(default=None, description="The host the rank runs on")


class AgentOut(BaseModel):
    id: int
    job_id: int
    host: str
    pid: int | None
    world_size: int
    ranks: list[RankOut]
    details: dict[str, Any]
    knobs: list[dict[str, Any]] = Field(description="The knobs the job declared")
    registered_at: datetime
    last_seen_at: datetime
    released: ReleasedConfigOut | None = Field(
        default=None, description="The desired version the job should run now"
    )


class AckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: int = Field(ge=1, le=INTEGER_MAX)
    version: int = Field(
        ge=1, le=INTEGER_MAX, description="The released desired version the job now runs"
    )
    step: int | None = Field(
        default=None, ge=0, le=INTEGER_MAX, description="The step it took effect at"
    )


class GpuOwnerOut(BaseModel):
    gpu_uuid: str
    job_id: int
    job: str
    labels: dict[str, str]
    rank: int
    host: str
    agent_id: int
