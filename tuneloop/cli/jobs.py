"""``tuneloop job diagnose``: where a job's step time goes, what bounds it and which ranks lag,
read straight from the store or the configured TSDB (no running API needed)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Annotated

import typer
from sqlalchemy import select

from tuneloop import errors
from tuneloop.cli import app
from tuneloop.cli.common import fail, open_runtime
from tuneloop.cli.tokens import _table
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
            query = select(Job).join(Project, Job.project_id == Project.id).where(Job.name == name)
            if project is not None:
                query = query.where(Project.name == project)
            matches = session.scalars(query).all()
            if not matches:
                fail(f"job {name!r} does not exist", 1)
            if len(matches) > 1:
                fail(f"job {name!r} is in several projects: add --project")
            connection = session.connection()
            found = job_diagnosis(
                runtime.series(connection),
                connection,
                matches[0],
                end=utcnow(),
                window=span,
                peak_flops=runtime.settings.peak_flops,
            )
    except errors.TemporaryError as exc:
        fail(str(exc))
    finally:
        runtime.close()
    _print(name, window, found)


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
