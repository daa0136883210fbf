"""Long-running commands: ``up`` (everything in one process), ``api`` and ``collect``."""

from __future__ import annotations

import gc
import logging
import signal
from typing import TYPE_CHECKING, Annotated

import typer

from tuneloop.cli import app
from tuneloop.cli.common import fail, open_runtime, settings_or_fail
from tuneloop.cli.data_lock import DataDirInUse, lock_data_dir
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from collector.fanout import WritePipeline
    from collector.service import SourcePlan
    from collector.status import StatusBoard

log = logging.getLogger("tuneloop")

STOP_TIMEOUT_S = 10.0
"""How long a stopping process keeps trying to write what waits; the rest stays spooled."""

HostOption = Annotated[str | None, typer.Option(help="Address to listen on [env TUNELOOP_HOST]")]
PortOption = Annotated[int | None, typer.Option(help="Port to listen on [env TUNELOOP_PORT]")]
SourceOption = Annotated[
    list[str] | None,
    typer.Option(
        "--source",
        help="A source to poll, repeatable: host, nvml, dcgm[=HOST[:PORT]], scrape=URL, "
        "infiniband[=PATH] or auto [env TUNELOOP_SOURCES, comma-separated; default: auto]",
    ),
]


def _configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if settings.log_level != "debug":
        # Alembic narrates every migration step at INFO; start-up output should stay short.
        logging.getLogger("alembic").setLevel(logging.WARNING)


def _serve(runtime: Runtime, pipeline: WritePipeline, board: StatusBoard | None = None) -> None:
    import uvicorn

    from api.main import create_app

    settings = runtime.settings
    config = uvicorn.Config(
        create_app(runtime, pipeline, collector_status=board),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler that was installed before it; turn that into a clean return.
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    # Everything alive now (modules, the app, caches) lives as long as the process: leaving it
    # out of every later collection cut the collector's share of OTLP ingest time (BENCHMARKS.md).
    gc.freeze()
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


def _pipeline(runtime: Runtime, registry: CollectorRegistry) -> WritePipeline:
    """The process's one write pipeline, not started yet: built first thing, so that a bad
    relabel config ends the command before anything else happens."""
    from collector.relabel import RelabelConfigError
    from collector.service import build_pipeline

    try:
        pipeline = build_pipeline(runtime, registry=registry)
    except RelabelConfigError as exc:
        runtime.close()
        fail(str(exc))
    return pipeline


def _sources(settings: Settings, *, from_flags: bool) -> SourcePlan:
    """The collector's sources, or exit 2 with one line on a bad spec: checked before the
    store is touched, like every other setting."""
    from collector.service import plan_sources
    from collector.sources import SourceSpecError

    try:
        return plan_sources(settings)
    except SourceSpecError as exc:
        fail(f"invalid setting {'--source' if from_flags else 'TUNELOOP_SOURCES'}: {exc}")


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
def up(host: HostOption = None, port: PortOption = None, source: SourceOption = None) -> None:
    """Run the whole control plane in one process: API, in-process tasks and collector.

    On the embedded default this needs no servers: the store is a SQLite file. The collector
    and the API's receivers share one write pipeline (one queue, one spool).
    """
    from prometheus_client import CollectorRegistry

    from collector.service import build_collector
    from collector.status import StatusBoard
    from tuneloop.taskqueue.inprocess import InProcessRunner

    settings = settings_or_fail(host=host, port=port, sources=source or None)
    try:
        # Held (open) until the process ends.
        data_lock = lock_data_dir(settings.data_dir)
    except DataDirInUse as exc:
        fail(str(exc))
    _configure_logging(settings)
    plan = _sources(settings, from_flags=bool(source))
    runtime = open_runtime(settings)
    pipeline = _pipeline(runtime, CollectorRegistry())
    _migrate(runtime)
    project_id, secret = _default_project(runtime)
    if plan.gpu_choice:
        log.info("%s", plan.gpu_choice)
    base = f"http://{settings.host}:{settings.port}"
    typer.echo(f"tuneloop {_version()} on {runtime.engine.url.render_as_string()}")
    typer.echo(f"  API        {base}/api/v1/  (OpenAPI: {base}/docs)")
    typer.echo(f"  health     {base}/healthz")
    typer.echo(f"  metrics    {base}/metrics")
    # OpenTelemetry exporters append the /v1/... paths to OTEL_EXPORTER_OTLP_ENDPOINT=base.
    typer.echo(f"  OTLP       {base}/v1/metrics")
    typer.echo(f"             {base}/v1/traces  (step timings: docs/step-timing.md)")
    typer.echo(f"  remote     {base}/api/v1/write  (Prometheus remote write: docs/prometheus.md)")
    if settings.remote_write_url:
        from tuneloop.storage.prometheus.remote_writer import without_credentials

        typer.echo(f"  forward    {without_credentials(settings.remote_write_url)}")
    typer.echo(f"  sources    {plan.describe()}")
    if secret is not None:
        typer.echo(f"  project    {settings.default_project}")
        typer.echo(f"  token      {secret}")
        typer.echo("             (shown once; create more with: tuneloop token create)")
    typer.echo("Press Ctrl-C to stop.")

    board = StatusBoard()
    tasks = InProcessRunner.for_settings(settings)
    collector = build_collector(
        pipeline,
        project_id,
        interval_s=settings.collect_interval_s,
        sources=plan.sources,
        intervals=plan.intervals,
        board=board,
    )
    pipeline.start()
    tasks.start()
    collector.start()
    try:
        _serve(runtime, pipeline, board)
    finally:
        collector.stop()
        pipeline.stop(timeout_s=STOP_TIMEOUT_S)
        tasks.stop()
        runtime.close()
        data_lock.close()
        typer.echo("tuneloop stopped.")


@app.command()
def api(host: HostOption = None, port: PortOption = None) -> None:
    """Run the API process alone (migrate first with: tuneloop db upgrade)."""
    from prometheus_client import CollectorRegistry

    settings = settings_or_fail(host=host, port=port)
    _configure_logging(settings)
    runtime = open_runtime(settings)
    pipeline = _pipeline(runtime, CollectorRegistry())
    pipeline.start()
    try:
        _serve(runtime, pipeline)
    finally:
        pipeline.stop(timeout_s=STOP_TIMEOUT_S)
        runtime.close()


@app.command()
def collect(
    project: Annotated[
        str | None,
        typer.Option(
            help="Project whose series receive the samples (default: TUNELOOP_DEFAULT_PROJECT)"
        ),
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds between polls of every source (default: by kind, "
            "TUNELOOP_COLLECT_INTERVAL_S, TUNELOOP_GPU_INTERVAL_S, TUNELOOP_SCRAPE_INTERVAL_S)"
        ),
    ] = None,
    source: SourceOption = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve the collector's own metrics on this port (/metrics)"),
    ] = None,
) -> None:
    """Run the collectors alone, writing into the store (--database-url). Several may run
    at once against one PostgreSQL."""
    import threading

    from prometheus_client import CollectorRegistry, start_http_server

    from collector.service import build_collector

    if interval is not None and not interval > 0:
        # Checked here: it feeds three settings, whose names are not the flag's.
        fail("invalid setting --interval: must be greater than 0")
    settings = settings_or_fail(
        collect_interval_s=interval,
        gpu_interval_s=interval,
        scrape_interval_s=interval,
        sources=source or None,
    )
    _configure_logging(settings)
    plan = _sources(settings, from_flags=bool(source))
    runtime = open_runtime(settings)
    registry = CollectorRegistry()
    pipeline = _pipeline(runtime, registry)
    project_id = _project_id(runtime, project or settings.default_project)
    server = None
    if metrics_port is not None:
        try:
            server, _ = start_http_server(metrics_port, addr=settings.host, registry=registry)
        except OSError as exc:
            runtime.close()
            fail(f"cannot serve metrics on {settings.host}:{metrics_port}: {exc.strerror}")
    runner = build_collector(
        pipeline,
        project_id,
        interval_s=settings.collect_interval_s,
        sources=plan.sources,
        intervals=plan.intervals,
    )
    if plan.gpu_choice:
        log.info("%s", plan.gpu_choice)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    pipeline.start()
    runner.start()
    typer.echo(f"collecting {plan.describe()}; Ctrl-C to stop")
    if server is not None:
        typer.echo(f"  metrics    http://{settings.host}:{metrics_port}/metrics")
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        runner.stop()
        pipeline.stop(timeout_s=STOP_TIMEOUT_S)
        if server is not None:
            server.shutdown()
        runtime.close()


def _version() -> str:
    from tuneloop import __version__

    return __version__
