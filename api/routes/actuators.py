"""A job's actuator: ``/api/v1/projects/{project}/jobs/{job}/actuator`` (policy, progress,
approval) and ``.../config/marks`` (verdicts on configs the job ran, for the tuner)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from actuators import job as actuator
from actuators.holds import hold
from actuators.policy_config import ActuationPolicy, PolicyError
from api.deps import API_PREFIX, AUTH_ERRORS, CurrentToken, SessionDep, require_member
from api.routes.jobs import JobDep
from api.schemas.actuators import ActuatorOut, ApproveIn, ConfigMarkOut
from tuneloop import accounts, job_configs
from tuneloop.storage.models import JobActuator

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}/jobs/{{job}}",
    tags=["actuator"],
    responses=AUTH_ERRORS,
)

POLICY_EXAMPLE: dict[str, Any] = {
    "bounds": {"batch_size": {"min": 8, "max": 512}, "sync_period": {"min": 1, "max": 8}},
    "max_change": {"batch_size": 4},
    "freeze_s": 60,
    "dry_run": False,
    "require_approval": False,
    "verify": {"metric": "tuneloop_samples_per_second", "settle_s": 10, "window_s": 60},
}


def _out(row: JobActuator | None) -> ActuatorOut:
    if row is None:
        return ActuatorOut(
            policy=ActuationPolicy().to_dict(),
            goal_version=None,
            released_version=None,
            last_good_version=None,
            approved_version=None,
            changed_at=None,
            conditions={},
        )
    return ActuatorOut(
        held=hold(row),
        policy=ActuationPolicy.from_dict(row.policy).to_dict(),
        goal_version=row.goal_version,
        released_version=row.released_version,
        last_good_version=row.last_good_version,
        approved_version=row.approved_version,
        changed_at=row.changed_at,
        conditions=row.conditions,
    )


@router.get("/actuator", summary="The job's actuation policy and progress")
def read_actuator(job: JobDep, session: SessionDep) -> ActuatorOut:
    return _out(job_configs.actuator_row(session, job))


@router.put("/actuator", summary="Set the job's actuation policy")
def set_actuator_policy(
    job: JobDep,
    session: SessionDep,
    token: CurrentToken,
    policy: Annotated[dict[str, Any], Body(examples=[POLICY_EXAMPLE])],
) -> ActuatorOut:
    """Bounds (desired configs outside them are refused), ``max_change`` per step,
    ``freeze_s`` after each change, ``dry_run``, ``require_approval`` and how changes are
    verified (``verify``). Fields left out take their defaults."""
    require_member(token, "setting an actuation policy")
    try:
        parsed = ActuationPolicy.from_dict(policy)
    except PolicyError as exc:
        raise PolicyError(f"invalid actuation policy: {exc}") from None  # a 422
    row = actuator.set_policy(session, job, parsed, actor=accounts.actor_name(token))
    return _out(row)


@router.post("/actuator/approve", summary="Approve desired versions up to one")
def approve(body: ApproveIn, job: JobDep, session: SessionDep, token: CurrentToken) -> ActuatorOut:
    require_member(token, "approving a desired version")
    row = actuator.approve(session, job, body.version, actor=accounts.actor_name(token))
    return _out(row)


@router.get("/config/marks", summary="Verdicts on configs the job ran (bad ones by default)")
def config_marks(
    job: JobDep,
    session: SessionDep,
    verdict: Annotated[str | None, Query(pattern="^(bad|good|all)$")] = "bad",
) -> list[ConfigMarkOut]:
    rows = job_configs.config_marks(session, job, None if verdict == "all" else verdict)
    return [ConfigMarkOut.model_validate(row) for row in rows]
