"""``tuneloop store``: maintenance of the built-in time-series store.

``tuneloop store compact`` compacts every closed chunk span outside the hot window now, with a
line of progress per batch of series; the periodic maintenance task does the same a little at a
time. On PostgreSQL both truncate the partitions they emptied, giving their disk back; on SQLite
the freed pages are reused by new samples, and ``--vacuum`` rebuilds the file to shrink it.
Exit codes: 0 done; 2 configuration or connection errors (one line on stderr).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from tuneloop.cli import app
from tuneloop.cli.common import fail, settings_or_fail
from tuneloop.storage import make_engine

store_app = typer.Typer(help="Maintain the built-in time-series store.", no_args_is_help=True)
app.add_typer(store_app, name="store")


@store_app.command()
def compact(
    hot_window_s: Annotated[
        int | None,
        typer.Option(
            min=0, help="Keep samples younger than this as rows [default: TUNELOOP_COMPACT_AFTER_S]"
        ),
    ] = None,
    batch_series: Annotated[
        int, typer.Option(min=1, help="Series per transaction (bounds memory and lock time).")
    ] = 500,
    vacuum: Annotated[
        bool,
        typer.Option(
            help="SQLite: then VACUUM, shrinking the file (rewrites all of it, writers wait). "
            "PostgreSQL needs none: emptied partitions are truncated."
        ),
    ] = False,
) -> None:
    """Compact closed chunk spans of raw samples into sample chunks (and merge late samples
    into theirs). Idempotent; safe to interrupt and run again."""
    # Imported here: the time-series code is not needed to list the commands.
    from tuneloop.storage.timeseries.compaction import compact as run_compaction
    from tuneloop.storage.timeseries.reclaim import vacuum_sqlite

    settings = settings_or_fail()
    engine = make_engine(settings.resolved_database_url)
    hot = None if hot_window_s is None else timedelta(seconds=hot_window_s)
    try:
        run_compaction(engine, hot_window=hot, batch_series=batch_series, progress=typer.echo)
        if vacuum and engine.dialect.name == "sqlite":
            vacuum_sqlite(engine, typer.echo)
        elif vacuum:
            typer.echo("--vacuum: nothing to do on PostgreSQL (emptied partitions are truncated)")
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        lines = str(orig if orig is not None else exc).strip().splitlines()
        fail(f"compaction failed: {lines[0] if lines else type(exc).__name__}")
    finally:
        engine.dispose()
