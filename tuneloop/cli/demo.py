"""``tuneloop demo``: tune a real 2-process PyTorch DDP job live on the embedded default and
print what it gained (``docs/demo.md``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tuneloop.cli import app
from tuneloop.cli.common import fail


@app.command()
def demo(
    trials: Annotated[int, typer.Option(min=2, help="Trials of the tuning study")] = 12,
    repeats: Annotated[
        int, typer.Option(min=2, help="Fresh training runs of each config in the comparison")
    ] = 8,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="3 trials, 2 runs each to 90%: checks that it all works (about 2 minutes)",
        ),
    ] = False,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the study and of the fresh runs")] = 0,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Empty directory for the store, logs and results [a new one]"),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the results to this file")
    ] = None,
) -> None:
    """Start the control plane (SQLite, in-process tasks) and a real 2-rank PyTorch
    DistributedDataParallel job on the CPU from a poor config; let the tuner (goodput) and the
    actuator improve it live; then time fresh runs of the starting config, a hand-picked
    default and the tuned config to a target validation accuracy, and print the table."""
    try:
        import torch  # noqa: F401
    except ImportError:
        fail("the demo needs PyTorch: pip install 'tuneloop[demo]'")
    from tuneloop.demo.processes import DemoError
    from tuneloop.demo.runner import DemoPlan, run_demo

    plan = (
        DemoPlan(trials=3, repeats=2, target_accuracy=0.9, tuned_run_s=3.0, seed=seed)
        if quick
        else DemoPlan(trials=trials, repeats=repeats, seed=seed)
    )
    if directory is not None and directory.exists() and any(directory.iterdir()):
        fail(f"--dir {directory} is not empty")
    try:
        summary = run_demo(plan, directory, lambda line: typer.echo(line))
    except DemoError as exc:
        fail(f"demo: {exc}")
    typer.echo("")
    for line in summary["report"]:
        typer.echo(line)
    typer.echo(f"(all results: {summary['workdir']}/demo.json)")
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=1))
