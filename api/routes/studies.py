"""Tuning studies of a job: ``/api/v1/projects/{project}/jobs/{job}/studies``.

Members and admins create studies (a study writes desired configs); every role of the project
reads them, and a job's agent drives an agent-driven study through ``ask`` and ``tell``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, status

from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    CurrentToken,
    PageDep,
    PathId,
    RuntimeDep,
    SessionDep,
    require_member,
)
from api.read_limits import ClientWatchDep
from api.routes.jobs import JobDep, diagnose
from api.schemas.common import Page
from api.schemas.studies import (
    AskIn,
    DiagnosedStudyOut,
    StudyCreate,
    StudyFromDiagnosisIn,
    StudyOut,
    StudyUpdate,
    TellIn,
    TrialOut,
)
from api.services import studies as study_service
from tuneloop import accounts
from tuneloop.errors import Conflict, NotFound
from tuneloop.storage.models import Study
from tuner import service

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}/jobs/{{job}}/studies",
    tags=["studies"],
    responses=AUTH_ERRORS,
)

STUDY_REF_DOC = "Study name, or study id when all digits"


def get_study(
    study: Annotated[str, Path(description=STUDY_REF_DOC)], job: JobDep, session: SessionDep
) -> Study:
    found = service.get_study(session, job, study)
    if found is None:
        raise NotFound(f"study {study!r} not found")
    return found


StudyDep = Annotated[Study, Depends(get_study)]


def _agent_driven(study: Study) -> None:
    if service.study_options(study).driven_by != "agent":
        raise Conflict(
            f"study {study.name!r} is driven by the tuner loop; create one with "
            '"driven_by": "agent" to ask and tell from the job',
        )


@router.post("", status_code=status.HTTP_201_CREATED, summary="Create a study for a job")
def create_study(
    body: StudyCreate,
    job: JobDep,
    session: SessionDep,
    token: CurrentToken,
    runtime: RuntimeDep,
) -> StudyOut:
    """Refused with 422 and the reason for empty or inverted bounds or bounds that exclude the
    job's current config, an unknown objective or strategy, bad options, a job without
    step-timing data in the store, without a desired config or (loop-driven studies) without
    an agent seen within ``ack_timeout_s``; 409 if the job already has a study of that name."""
    require_member(token, "creating a study")
    study = study_service.create_study(
        session, job, body, actor=accounts.actor_name(token), series=runtime.remote_series
    )
    return StudyOut.of(study)


@router.post(
    "/from-diagnosis",
    status_code=status.HTTP_201_CREATED,
    summary="Create a study over the knobs the job's diagnosis points at",
    responses={409: {"description": "The verdict points at no knob the job declared"}},
)
def create_study_from_diagnosis(
    body: StudyFromDiagnosisIn,
    job: JobDep,
    session: SessionDep,
    token: CurrentToken,
    runtime: RuntimeDep,
    client: ClientWatchDep,
) -> DiagnosedStudyOut:
    """Diagnoses the job over ``window`` and starts a tuner-driven study of its throughput
    over the knobs it declared that the verdict points at (input-bound: the loader's workers
    and prefetch; communication-bound: bucket size, gradient compression, sync period;
    compute- or memory-bound: batch size; docs/diagnosis.md). 409 when the verdict is
    ``no_data``, ``idle`` or ``mixed`` or the job declared none of its knobs; 422 as for any
    study."""
    require_member(token, "creating a study")
    found = diagnose(job, runtime, session, client, body.window, None)
    study, knobs = study_service.create_from_diagnosis(
        session, job, body, found, actor=accounts.actor_name(token), series=runtime.remote_series
    )
    return DiagnosedStudyOut(
        **StudyOut.of(study).model_dump(), verdict=found.verdict.value, knobs=knobs
    )


@router.get("", summary="A job's studies")
def list_studies(job: JobDep, session: SessionDep, _token: CurrentToken) -> list[StudyOut]:
    return [StudyOut.of(study) for study in service.list_studies(session, job)]


@router.get("/{study}", summary="One study")
def read_study(study: StudyDep) -> StudyOut:
    return StudyOut.of(study)


@router.patch("/{study}", summary="Stop or resume a study")
def update_study(
    body: StudyUpdate, study: StudyDep, session: SessionDep, token: CurrentToken
) -> StudyOut:
    """Stopping puts the job back on its pre-study config; 409 for a study that has ended."""
    require_member(token, "stopping or resuming a study")
    service.set_state(session, study, body.state, actor=accounts.actor_name(token))
    return StudyOut.of(study)


@router.delete(
    "/{study}",
    summary="Cancel a study",
    responses={409: {"description": "The study has already ended complete or failed"}},
)
def cancel_study(study: StudyDep, session: SessionDep, token: CurrentToken) -> StudyOut:
    """Cancels a running or stopped study: its running trial fails, the job goes back on its
    pre-study config and the study ends ``cancelled`` (the study and its trials stay, to read).
    Cancelling a cancelled study again answers it unchanged."""
    require_member(token, "cancelling a study")
    service.cancel_study(session, study, actor=accounts.actor_name(token))
    return StudyOut.of(study)


@router.get("/{study}/trials", summary="A study's trials, in order")
def list_trials(study: StudyDep, session: SessionDep, page: PageDep) -> Page[TrialOut]:
    rows = service.list_trials(session, study, limit=page.fetch, offset=page.offset)
    return page.build(rows, TrialOut.of)


@router.get("/{study}/best", summary="The best trial so far and its config")
def best_trial(study: StudyDep, session: SessionDep) -> TrialOut:
    top = service.best(session, study)
    if top is None:
        raise NotFound(f"study {study.name!r} has no complete trial yet")
    return TrialOut.of(top)


@router.post(
    "/{study}/ask",
    status_code=status.HTTP_201_CREATED,
    summary="Next configuration to try (agent-driven studies)",
)
def ask(
    study: StudyDep, session: SessionDep, token: CurrentToken, body: AskIn | None = None
) -> TrialOut:
    """A new ``running`` trial; its params carry the learning rate for the job's ranks."""
    _agent_driven(study)
    _running(study)
    trial = service.ask(
        session,
        study,
        context=body.context if body else None,
        actor=accounts.actor_name(token),
    )
    return TrialOut.of(trial)


@router.post("/{study}/trials/{number}/tell", summary="Report a trial's result (agent-driven)")
def tell(
    body: TellIn,
    number: PathId,
    study: StudyDep,
    session: SessionDep,
    token: CurrentToken,
) -> TrialOut:
    """Telling the same result again is a no-op; a different one for a finished trial is 409.
    ``complete`` needs a finite ``value``; ``infeasible`` and ``failed`` need a ``reason``
    (``oom`` for out of memory: larger batches are not proposed again)."""
    _agent_driven(study)
    trial = service.tell(
        session,
        study,
        number,
        state=body.state,
        value=body.value,
        stderr=body.stderr,
        reason=body.reason,
        measurements=body.measurements,
        actor=accounts.actor_name(token),
    )
    return TrialOut.of(trial)


def _running(study: Study) -> None:
    if study.state != "running":
        raise Conflict(f"study {study.name!r} is {study.state}")
