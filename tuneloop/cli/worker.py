"""``tuneloop worker`` and ``tuneloop beat``: the Celery processes, for deployments with Redis.

Without ``TUNELOOP_REDIS_URL`` there is nothing for them to do: ``tuneloop up`` runs the same
periodic tasks in-process.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tuneloop.cli import app
from tuneloop.cli.common import fail, open_runtime, settings_or_fail
from tuneloop.settings import Settings
from tuneloop.taskqueue.celery_app import create_app


def _celery_settings(command: str) -> Settings:
    settings = settings_or_fail()
    if not settings.redis_url:
        fail(
            f"`tuneloop {command}` needs Redis: set TUNELOOP_REDIS_URL or --redis-url "
            "(without Redis, `tuneloop up` runs the tasks in-process)"
        )
    return settings


def _exit_with(code: object) -> None:
    # Celery returns its click exit code instead of raising.
    if isinstance(code, int) and code != 0:
        raise typer.Exit(code)


@app.command()
def worker(
    concurrency: Annotated[
        int, typer.Option(min=1, help="Task processes, each with its own database pool")
    ] = 2,
    pool: Annotated[str, typer.Option(help="prefork, threads or solo")] = "prefork",
) -> None:
    """Run a Celery worker that executes tuneloop's tasks (needs TUNELOOP_REDIS_URL)."""
    settings = _celery_settings("worker")
    # Fail at start-up, in one line, rather than in every task.
    open_runtime(settings).close()
    argv = [
        "worker",
        f"--loglevel={settings.log_level.upper()}",
        f"--pool={pool}",
        "--hostname=tuneloop@%h",
        # Gossip and mingle only sync worker-to-worker state tuneloop does not use; skipping
        # them saves broker traffic and start-up time.
        "--without-gossip",
        "--without-mingle",
        # Not one per CPU: the periodic tasks are few and each process holds database
        # connections.
        f"--concurrency={concurrency}",
    ]
    _exit_with(create_app(settings).worker_main(argv))


@app.command()
def beat() -> None:
    """Run Celery beat, which enqueues the periodic tasks (needs TUNELOOP_REDIS_URL).

    Run exactly one beat per deployment, or every tick is enqueued once per beat.
    """
    settings = _celery_settings("beat")
    # Beat remembers its last runs in this file, so a restart does not re-run every task.
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    schedule = settings.data_dir / "celerybeat-schedule"
    argv = ["beat", f"--loglevel={settings.log_level.upper()}", f"--schedule={schedule}"]
    _exit_with(create_app(settings).start(argv))
