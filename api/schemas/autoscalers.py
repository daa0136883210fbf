"""Request and response bodies of ``/api/v1/projects/{project}/autoscalers``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"

TARGET_DOC = (
    'kubernetes: {"kind": "Deployment" or "StatefulSet", "namespace": ..., "name": ...} '
    '(the cluster and its credentials are the server\'s own); webhook: {"url": "https://..."}'
)
POLICY_DOC = (
    "ScalePolicy fields: min_replicas, max_replicas, p99_slo_s, target_queue_per_replica, "
    "tolerance, queue_lookahead_s, scale_in_stabilization_s, scale_out_stabilization_s, "
    "period_s, scale_out_pods, scale_out_percent, scale_in_percent, max_metric_age_s "
    "(those left out take their defaults)"
)


class SelectorIn(BaseModel):
    """Series of this project: a metric name and PromQL label matchers, all of which hold;
    or, instead of both, a PromQL expression (``expr``) evaluated by tuneloop's engine."""

    model_config = ConfigDict(extra="forbid")

    metric: str | None = Field(default=None, examples=["llm_request_latency_p99_seconds"])
    match: list[str] = Field(default_factory=list, examples=[['service="llama"']])
    expr: str | None = Field(
        default=None,
        examples=['max(llm_request_latency_p99_seconds{service="llama"})'],
        description="A PromQL expression, instead of metric and match",
    )

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A selector shows what it is: metric and match, or expr, not the other's nulls.
        out: dict[str, Any] = handler(self)
        return {key: value for key, value in out.items() if value is not None}


class AutoscalerUpdate(BaseModel):
    """An autoscaler's whole definition (``PUT`` replaces it). Changing ``target_kind`` or
    ``target`` needs an admin token; members may change the rest."""

    model_config = ConfigDict(extra="forbid")

    target_kind: str = Field(description="kubernetes or webhook", examples=["kubernetes"])
    target: dict[str, Any] = Field(
        description=TARGET_DOC,
        examples=[{"kind": "Deployment", "namespace": "serving", "name": "llama"}],
    )
    policy: dict[str, Any] = Field(
        description=POLICY_DOC, examples=[{"min_replicas": 2, "max_replicas": 20, "p99_slo_s": 0.5}]
    )
    p99: SelectorIn | None = Field(
        default=None, description="The P99 latency in seconds; needed with p99_slo_s"
    )
    queue: SelectorIn | None = Field(
        default=None,
        description="Requests waiting (summed over the series); needed with "
        "target_queue_per_replica",
    )
    dry_run: bool = Field(default=False, description="Decide and record, never scale")
    enabled: bool = True


class AutoscalerCreate(AutoscalerUpdate):
    name: str = Field(pattern=NAME_PATTERN, examples=["llama-serving"])


class AutoscalerOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    target_kind: str
    target: dict[str, Any]
    policy: dict[str, Any]
    p99: SelectorIn | None = Field(validation_alias="p99_selector")
    queue: SelectorIn | None = Field(validation_alias="queue_selector")
    dry_run: bool
    enabled: bool
    created_at: datetime
    updated_at: datetime


class AutoscalerStateOut(BaseModel):
    """What the reconcile loop last saw and did."""

    model_config = ConfigDict(from_attributes=True)

    name: str
    enabled: bool
    dry_run: bool
    replicas: int | None = Field(description="What the target ran at the last pass")
    last_decision: int | None = Field(description="Replicas the last decision asked for")
    last_reason: str | None = Field(
        description="stale_metrics, within_tolerance, scale_out, scale_in, stabilizing, "
        "rate_limited, at_min, at_max or bounds"
    )
    last_decision_at: datetime | None = Field(description="When the decision last changed")
    last_error: str | None = Field(description="Why the last pass failed; null once one works")
    last_error_at: datetime | None
    state: dict[str, Any] = Field(
        description="Remembered recommendations and scale events ([epoch seconds, replicas])"
    )
