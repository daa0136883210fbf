"""Long-running commands: ``up`` (everything in one process), ``api`` and ``collector``."""

from __future__ import annotations

import logging
import signal
from typing import Annotated

import typer

from tuneloop.cli import app
from tuneloop.cli.common import fail, open_runtime, settings_or_fail
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings

log = logging.getLogger("tuneloop")

HostOption = Annotated[str | None, typer.Option(help="Address to listen on [env TUNELOOP_HOST]")]
PortOption = Annotated[int | None, typer.Option(help="Port to listen on [env TUNELOOP_PORT]")]


def _configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if settings.log_level != "debug":
        # Alembic narrates every migration step at INFO; start-up output should stay short.
        logging.getLogger("alembic").setLevel(logging.WARNING)


def _serve(runtime: Runtime) -> None:
    import uvicorn

    from api.main import create_app

    settings = runtime.settings
    config = uvicorn.Config(
        create_app(runtime),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler that was installed before it; turn that into a clean return.
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        server.run()
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        fail(f"could not listen on {settings.host}:{settings.port} (see the log above)")


class _Stopped(Exception):
    """SIGTERM arrived: stop like on Ctrl-C."""


def _raise_stopped(*_: object) -> None:
    raise _Stopped


def _migrate(runtime: Runtime) -> None:
    from tuneloop.storage.migrate import upgrade

    upgrade(runtime.settings.resolved_database_url)


def _default_project(runtime: Runtime) -> tuple[int, str | None]:
    from tuneloop.accounts import ensure_default_project
    from tuneloop.storage import session_scope

    with session_scope(runtime.sessions) as session:
        project, secret = ensure_default_project(session, runtime.settings.default_project)
        return project.id, secret


def _project_id(runtime: Runtime, name: str) -> int:
    from tuneloop.accounts import get_project_by_name

    with runtime.sessions() as session:
        project = get_project_by_name(session, name)
        if project is None:
            fail(f"no project named {name!r} (create it with: tuneloop project create {name})")
        return project.id


@app.command()
def up(host: HostOption = None, port: PortOption = None) -> None:
    """Run the whole control plane in one process: API, in-process tasks and host collector.

    On the embedded default this needs no servers: the store is a SQLite file.
    """
    from collector.service import build_collector
    from tuneloop.taskqueue.inprocess import InProcessRunner

    settings = settings_or_fail(host=host, port=port)
    _configure_logging(settings)
    runtime = open_runtime(settings)
    _migrate(runtime)
    project_id, secret = _default_project(runtime)
    base = f"http://{settings.host}:{settings.port}"
    typer.echo(f"tuneloop {_version()} on {runtime.engine.url.render_as_string()}")
    typer.echo(f"  API        {base}/api/v1/  (OpenAPI: {base}/docs)")
    typer.echo(f"  health     {base}/healthz")
    typer.echo(f"  metrics    {base}/metrics")
    if secret is not None:
        typer.echo(f"  project    {settings.default_project}")
        typer.echo(f"  token      {secret}")
        typer.echo("             (shown once; create more with: tuneloop token create)")
    typer.echo("Press Ctrl-C to stop.")

    tasks = InProcessRunner.for_settings(settings)
    collector = build_collector(runtime, project_id, interval_s=settings.collect_interval_s)
    tasks.start()
    collector.start()
    try:
        _serve(runtime)
    finally:
        collector.stop()
        tasks.stop()
        runtime.close()
        typer.echo("tuneloop stopped.")


@app.command()
def api(host: HostOption = None, port: PortOption = None) -> None:
    """Run the API process alone (migrate first with: tuneloop db upgrade)."""
    settings = settings_or_fail(host=host, port=port)
    _configure_logging(settings)
    runtime = open_runtime(settings)
    try:
        _serve(runtime)
    finally:
        runtime.close()


@app.command()
def collector(
    project: Annotated[
        str | None, typer.Option(help="Project whose series receive the samples")
    ] = None,
    interval: Annotated[
        float | None, typer.Option(help="Seconds between polls [env TUNELOOP_COLLECT_INTERVAL_S]")
    ] = None,
) -> None:
    """Run the host collector alone, writing into the store."""
    import threading

    from collector.service import build_collector

    settings = settings_or_fail(collect_interval_s=interval)
    _configure_logging(settings)
    runtime = open_runtime(settings)
    project_id = _project_id(runtime, project or settings.default_project)
    runner = build_collector(runtime, project_id, interval_s=settings.collect_interval_s)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner.start()
    typer.echo(f"collecting every {settings.collect_interval_s:g}s; Ctrl-C to stop")
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        runner.stop()
        runtime.close()


def _version() -> str:
    from tuneloop import __version__

    return __version__
