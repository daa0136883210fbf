"""The ``tuneloop`` command line.

Global flags (``--database-url``, ``--redis-url``, ...) override ``TUNELOOP_*`` variables.
Configuration and connection errors end the command with one line on stderr and exit code 2,
never a traceback.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tuneloop.cli.common import fail
from tuneloop.settings import SettingsError, configure, load_settings

app = typer.Typer(
    name="tuneloop",
    help="Observability and auto-tuning control plane for GPU training and inference fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _global_options(
    database_url: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL [env TUNELOOP_DATABASE_URL]")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="Celery broker URL [env TUNELOOP_REDIS_URL]")
    ] = None,
    data_dir: Annotated[
        str | None, typer.Option(help="Where the embedded database lives [env TUNELOOP_DATA_DIR]")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="[env TUNELOOP_LOG_LEVEL]")] = None,
) -> None:
    try:
        configure(
            load_settings(
                database_url=database_url,
                redis_url=redis_url,
                data_dir=data_dir,
                log_level=log_level,
            )
        )
    except SettingsError as exc:
        fail(str(exc))


def _register_commands() -> None:
    # Each module adds its commands to ``app``; imported here so ``tuneloop --help`` lists all.
    from tuneloop.cli import commands  # noqa: F401


def main() -> None:
    _register_commands()
    app()
