"""Warm starts: the trials of earlier studies of jobs with the same model signature and
hardware, which prime a new study's strategy (docs/tuner.md, "Warm start")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneloop.storage.models import Job, Study, Trial
from tuner.strategies.base import Observation, warm_start
from tuner.study_records import history, study_options, study_space

SIGNATURE_LABELS: Sequence[str] = ("model", "accelerator")
"""Job labels that make up the model signature and hardware: studies of jobs that agree on all
of them (and on the objective and, when both know it, the ranks) warm-start each other."""
MAX_WARM_START_STUDIES = 10


def job_signature(job: Job) -> dict[str, str] | None:
    """The job's :data:`SIGNATURE_LABELS`, or ``None`` if it lacks one of them."""
    labels = job.labels or {}
    if not all(labels.get(name) for name in SIGNATURE_LABELS):
        return None
    return {name: str(labels[name]) for name in SIGNATURE_LABELS}


def warm_start_studies(
    session: Session, job: Job, objective: str, ranks: int | None = None
) -> list[int]:
    """Ids of the latest studies (at most :data:`MAX_WARM_START_STUDIES`) of the project's jobs
    with ``job``'s signature and the same objective that have a finished trial; when both
    sides know the ranks, they must agree. Empty when the job has no full signature."""
    signature = job_signature(job)
    if signature is None:
        return []
    finished = select(Trial.study_id).where(Trial.state.in_(("complete", "infeasible")))
    candidates = session.execute(
        select(Study, Job)
        .join(Job, Study.job_id == Job.id)
        .where(
            Job.project_id == job.project_id,
            Study.objective == objective,
            Study.id.in_(finished),
        )
        .order_by(Study.id.desc())
    ).all()
    chosen: list[int] = []
    for study, other in candidates:
        if job_signature(other) != signature:
            continue
        other_ranks = study_options(study).ranks
        if ranks is not None and other_ranks is not None and ranks != other_ranks:
            continue
        chosen.append(study.id)
        if len(chosen) == MAX_WARM_START_STUDIES:
            break
    return sorted(chosen)


def prior_observations(session: Session, study: Study) -> tuple[Observation, ...]:
    """The trials of the study's warm-start studies, ready to prepend to its history."""
    space = study_space(study)
    collected: list[Observation] = []
    for other_id in study_options(study).warm_start_from:
        other = session.get(Study, other_id)
        if other is None or other.id == study.id:
            continue  # deleted since: its evidence is gone with it
        for obs in history(session, other):
            # Numbered in the order collected so that several studies never clash.
            collected.append(replace(obs, number=len(collected)))
    return warm_start(collected, space)
