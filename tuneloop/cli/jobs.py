"""``tuneloop job diagnose``: where a job's step time goes, what bounds it and which ranks lag,
read straight from the store or the configured TSDB (no running API needed); ``tuneloop job
tune --from-diagnosis``: a study over the knobs the diagnosis points at."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Annotated

import typer
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.schemas.studies import StudyFromDiagnosisIn
from api.services.studies import create_from_diagnosis
from tuneloop import errors
from tuneloop.cli import app
from tuneloop.cli.common import fail, open_runtime
from tuneloop.cli.tokens import CLI_ACTOR, _table
from tuneloop.runtime import Runtime
from tuneloop.settings import get_settings
from tuneloop.storage import session_scope
from tuneloop.storage.models import Job, Project
from tuneloop.storage.timeseries.times import parse_duration
from tuneloop.storage.types import utcnow
from tuner.diagnosis import Diagnosis
from tuner.diagnosis_reading import job_diagnosis

job_app = typer.Typer(help="See how a job runs.", no_args_is_help=True)
app.add_typer(job_app, name="job")


@job_app.command("diagnose")
def job_diagnose(
    name: Annotated[str, typer.Argument(help="The job's name")],
    project: Annotated[str | None, typer.Option(help="The job's project")] = None,
    window: Annotated[str, typer.Option(help="How far back to look (5m, 1h, 300)")] = "5m",
) -> None:
    """The job's verdict (input-, communication-, compute-, memory-bound, idle), the share of
    its step in each phase, and the ranks that lag (docs/diagnosis.md)."""
    try:
        span = timedelta(seconds=parse_duration(window))
    except ValueError as exc:
        fail(f"--window: {exc}")
    runtime = open_runtime(get_settings())
    try:
        with session_scope(runtime.sessions) as session:
            found = diagnose(runtime, session, find_job(session, name, project), span)
    except errors.TemporaryError as exc:
        fail(str(exc))
    finally:
        runtime.close()
    _print(name, window, found)


def find_job(session: Session, name: str, project: str | None) -> Job:
    query = select(Job).join(Project, Job.project_id == Project.id).where(Job.name == name)
    if project is not None:
        query = query.where(Project.name == project)
    matches = session.scalars(query).all()
    if not matches:
        fail(f"job {name!r} does not exist", 1)
    if len(matches) > 1:
        fail(f"job {name!r} is in several projects: add --project")
    return matches[0]


def diagnose(runtime: Runtime, session: Session, job: Job, span: timedelta) -> Diagnosis:
    connection = session.connection()
    return job_diagnosis(
        runtime.series(connection),
        connection,
        job,
        end=utcnow(),
        window=span,
        peak_flops=runtime.settings.peak_flops,
    )


@job_app.command("tune")
def job_tune(
    name: Annotated[str, typer.Argument(help="The job's name")],
    from_diagnosis: Annotated[
        bool, typer.Option("--from-diagnosis", help="Tune the knobs its diagnosis points at")
    ] = False,
    project: Annotated[str | None, typer.Option(help="The job's project")] = None,
    window: Annotated[str, typer.Option(help="The diagnosis window (5m, 1h, 300)")] = "5m",
    study: Annotated[str | None, typer.Option(help="The study's name [diagnosis-...]")] = None,
    strategy: Annotated[str, typer.Option(help="bayesian, bandit, grid or random")] = "bayesian",
    max_trials: Annotated[int | None, typer.Option(min=1, help="Stop after this many")] = None,
) -> None:
    """Start a study of the job's throughput over the knobs it declared that its diagnosis
    points at (input-bound: loader workers and prefetch; communication-bound: bucket size,
    gradient compression, sync period; compute- or memory-bound: batch size;
    docs/diagnosis.md). The tuner's worker runs it."""
    if not from_diagnosis:
        fail("say what to tune: --from-diagnosis (other studies: POST .../studies, docs/tuner.md)")
    try:
        span = timedelta(seconds=parse_duration(window))
    except ValueError as exc:
        fail(f"--window: {exc}")
    body = StudyFromDiagnosisIn(name=study, window=window, strategy=strategy, max_trials=max_trials)
    runtime = open_runtime(get_settings())
    try:
        with session_scope(runtime.sessions) as session:
            job = find_job(session, name, project)
            found = diagnose(runtime, session, job, span)
            created, knobs = create_from_diagnosis(
                session, job, body, found, actor=CLI_ACTOR, series=runtime.remote_series
            )
            typer.echo(
                f"job {name!r} is {found.verdict.value}: study {created.id} {created.name!r} "
                f"tunes {', '.join(knobs)} for throughput"
            )
    except errors.TemporaryError as exc:
        fail(str(exc))
    except errors.PermanentError as exc:
        fail(str(exc), 1)
    finally:
        runtime.close()


def _print(name: str, window: str, found: Diagnosis) -> None:
    typer.echo(f"job {name!r}, last {window}: {found.verdict.value}: {found.summary}")
    for line in found.evidence:
        typer.echo(f"  {line}")
    if found.step_seconds is not None:
        typer.echo(f"step {found.step_seconds:.4g} s, {found.ranks} rank(s)")
    if found.shares:
        _table(
            ("PHASE", "SHARE", "INTERVAL", "SECONDS"),
            [
                (s.phase, f"{s.share:.1%}", _interval(s.low, s.high), f"{s.seconds:.4g}")
                for s in found.shares
            ],
        )
    if found.stragglers:
        typer.echo("stragglers:")
        _table(
            ("RANK", "HOST", "GPUS", "IN", "SECONDS", "OTHERS", "EXCESS"),
            [
                (
                    s.rank,
                    s.host or "-",
                    ",".join(s.gpus) or "-",
                    s.metric,
                    f"{s.seconds:.4g}",
                    f"{s.others_median:.4g}",
                    f"+{s.excess / s.others_median:.0%}" if s.others_median else "-",
                )
                for s in found.stragglers
            ],
        )
    else:
        typer.echo("stragglers: none")
    for out in found.excluded:
        typer.echo(f"excluded: rank {out.rank}: {out.reason}")
    _print_hardware(found)


def _print_hardware(found: Diagnosis) -> None:
    gpu = found.gpu
    if gpu is not None:
        figures = [
            f"{name} {value:.0%}"
            for name, value in (
                ("utilisation", gpu.utilization),
                ("SM active", gpu.sm_active),
                ("tensor active", gpu.tensor_active),
                ("DRAM active", gpu.dram_active),
            )
            if value is not None
        ]
        models = f" ({', '.join(gpu.model_names)})" if gpu.model_names else ""
        typer.echo(f"GPUs{models}: {', '.join(figures) or 'no activity reported'}")
    work = found.efficiency
    if work is None:
        return
    if work.mfu is not None and work.achieved_flops is not None and work.peak_flops:
        typer.echo(
            f"MFU {work.mfu:.1%}: {work.achieved_flops / 1e12:.4g} of "
            f"{work.peak_flops / 1e12:.4g} TFLOP/s per GPU ({work.peak_source})"
        )
    else:
        typer.echo(f"MFU excluded: {work.excluded}")


def _interval(low: float, high: float) -> str:
    return f"{low:.1%}..{high:.1%}" if math.isfinite(high) else "-"
