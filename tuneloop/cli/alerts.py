"""``tuneloop alerts ...``: check rule files, load them (or the default pack) into a project."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from tuneloop.cli import app
from tuneloop.cli.common import fail, open_runtime
from tuneloop.settings import get_settings

alerts_app = typer.Typer(help="Alert rule files and the default rule pack.", no_args_is_help=True)
app.add_typer(alerts_app, name="alerts")

PACK_SOURCE = "pack:gpu-fleet"
FilesArgument = Annotated[
    list[Path] | None, typer.Argument(help="YAML rule files", exists=True, dir_okay=False)
]


def pack_text() -> str:
    return resources.files("alerts").joinpath("pack/gpu-fleet.yaml").read_text()


@alerts_app.command("check")
def check(files: FilesArgument = None) -> None:
    """Check rule files without a database: syntax, queries, templates, known metrics."""
    from alerts.catalog import known_metrics
    from alerts.rules import RuleError, parse_rule_file

    problems = 0
    for path in files or []:
        try:
            parsed = parse_rule_file(path.read_text(), source=str(path))
        except RuleError as exc:
            typer.echo(str(exc), err=True)
            problems += 1
            continue
        for rule in parsed.rules:
            if rule.query is None:
                continue  # PromQL: checked by the parser already
            metric = rule.query.metric
            if rule.query.aggregation == "histogram_quantile":
                metric += "_bucket"
            if metric not in known_metrics():
                typer.echo(
                    f"{path}: rule {rule.name}: metric {metric!r} is not one the collectors "
                    "write; loading checks it against the project's series",
                    err=True,
                )
        typer.echo(f"{path}: {len(parsed.rules)} rules, {len(parsed.inhibit_rules)} inhibit rules")
    if problems:
        raise typer.Exit(1)


@alerts_app.command("load")
def load(
    files: FilesArgument = None,
    project: Annotated[
        str | None, typer.Option(help="Project to load into [default: TUNELOOP_DEFAULT_PROJECT]")
    ] = None,
    pack: Annotated[bool, typer.Option("--pack", help="Load the default GPU-fleet pack")] = False,
) -> None:
    """Create or update the rules of each file (all or nothing per file). Rules a file held
    before and no longer has are deleted; loading the same file again changes nothing."""
    from alerts import store
    from alerts.rules import parse_rule_file
    from tuneloop import accounts, errors
    from tuneloop.storage import session_scope

    sources = [(str(path.resolve()), path.read_text()) for path in files or []]
    if pack:
        sources.append((PACK_SOURCE, pack_text()))
    if not sources:
        fail("give rule files, or --pack for the default pack")
    settings = get_settings()
    name = project or settings.default_project
    runtime = open_runtime(settings)
    try:
        for source, text in sources:
            try:
                parsed = parse_rule_file(
                    text, source=source, runbook_base_url=settings.alerts_runbook_base_url
                )
                with session_scope(runtime.sessions) as session:
                    found = accounts.get_project_by_name(session, name)
                    if found is None:
                        fail(f"project {name!r} does not exist", 1)
                    outcome = store.load_rule_file(
                        session,
                        found,
                        parsed,
                        source=source,
                        actor="cli",
                        series=runtime.remote_series,
                    )
            except errors.PermanentError as exc:  # RuleError among them
                fail(str(exc), 1)
            summary = ", ".join(f"{len(names)} {what}" for what, names in outcome.items())
            typer.echo(f"{source}: {summary}")
    finally:
        runtime.close()
