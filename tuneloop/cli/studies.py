"""``tuneloop study list``, ``show`` and ``cancel``: tuning studies and their trials, straight
from the store (no running API needed)."""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneloop.cli import app
from tuneloop.cli.common import db_session, fail
from tuneloop.cli.tokens import CLI_ACTOR, _table, _when
from tuneloop.storage.models import Job, Project, Study, Trial
from tuneloop.storage.types import row_id
from tuner import service
from tuner.trial_measurements import TrialMeasurements

study_app = typer.Typer(
    help="See tuning studies and their trials; cancel a study.", no_args_is_help=True
)
app.add_typer(study_app, name="study")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


@study_app.command("list")
def study_list(
    project: Annotated[str | None, typer.Option(help="Only this project's studies")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job's studies (by name)")] = None,
) -> None:
    """List studies with their state, trial count and best value."""
    with db_session() as session:
        query = (
            select(Study, Job, Project)
            .join(Job, Study.job_id == Job.id)
            .join(Project, Job.project_id == Project.id)
            .order_by(Study.id)
        )
        if project is not None:
            query = query.where(Project.name == project)
        if job is not None:
            query = query.where(Job.name == job)
        rows = []
        for study, owner, proj in session.execute(query).all():
            trials = session.scalar(
                select(func.count()).select_from(Trial).where(Trial.study_id == study.id)
            )
            top = service.best(session, study)
            rows.append(
                (
                    str(study.id),
                    proj.name,
                    owner.name,
                    study.name,
                    study.objective,
                    study.strategy,
                    study.state,
                    str(trials or 0),
                    _number(top.value if top is not None else None),
                )
            )
    _table(
        ("ID", "PROJECT", "JOB", "NAME", "OBJECTIVE", "STRATEGY", "STATE", "TRIALS", "BEST"), rows
    )


@study_app.command("show")
def study_show(study_id: Annotated[int, typer.Argument(help="Study id (see study list)")]) -> None:
    """A study's trials (config, state, value, reason) and its best config."""
    with db_session() as session:
        study = session.get(Study, study_id)
        if study is None:
            fail(f"study {study_id} does not exist (see: tuneloop study list)", 1)
        trials = session.scalars(
            select(Trial).where(Trial.study_id == study.id).order_by(Trial.number)
        ).all()
        top = service.best(session, study)
        typer.echo(
            f"study {study.id} {study.name!r}: {study.objective} ({study.direction}), "
            f"{study.strategy}, {study.state}"
        )
        if study.end_reason:
            typer.echo(f"{study.state}: {study.end_reason}")
        rows = [
            (
                str(t.number),
                t.state,
                " ".join(f"{k}={v}" for k, v in sorted(t.params.items())),
                _number(t.value),
                str(t.desired_version or "-"),
                _when(t.started_at),
                _trial_reason(t),
            )
            for t in trials
        ]
        _table(("TRIAL", "STATE", "CONFIG", "VALUE", "VERSION", "STARTED", "REASON"), rows)
        if top is not None:
            config = " ".join(f"{k}={v}" for k, v in sorted(top.params.items()))
            typer.echo(f"best: trial {top.number}, value {_number(top.value)}: {config}")


def _trial_reason(trial: Trial) -> str:
    reason = TrialMeasurements.from_json(trial.measurements).reason
    if not trial.baseline:
        return reason
    return f"pre-study config; {reason}" if reason else "pre-study config"


@study_app.command("cancel")
def study_cancel(
    ref: Annotated[str, typer.Argument(help="Study id (see study list), or name with --job")],
    job: Annotated[str | None, typer.Option(help="The study's job, to find it by name")] = None,
    project: Annotated[str | None, typer.Option(help="The job's project")] = None,
) -> None:
    """Cancel a running or stopped study: the job goes back on its pre-study config."""
    with db_session() as session:
        study = _find_study(session, ref, job, project)
        try:
            changed = service.cancel_study(session, study, actor=CLI_ACTOR)
        except service.StudyEndedError as exc:
            fail(str(exc), 1)
        note = "cancelled" if changed else "was already cancelled"
        typer.echo(f"study {study.id} {study.name!r} {note}: {study.end_reason}")


def _find_study(session: Session, ref: str, job: str | None, project: str | None) -> Study:
    if ref.isascii() and ref.isdigit():
        study_id = row_id(ref)
        found = session.get(Study, study_id) if study_id is not None else None
    elif job is None:
        fail(f"study {ref!r}: give its id, or its job with --job (see: tuneloop study list)")
    else:
        query = (
            select(Study)
            .join(Job, Study.job_id == Job.id)
            .where(Study.name == ref, Job.name == job)
        )
        if project is not None:
            query = query.join(Project, Job.project_id == Project.id).where(Project.name == project)
        matches = session.scalars(query).all()
        if len(matches) > 1:
            fail(f"study {ref!r} of job {job!r} is in several projects: add --project")
        found = matches[0] if matches else None
    if found is None:
        fail(f"study {ref!r} does not exist (see: tuneloop study list)", 1)
    return found
