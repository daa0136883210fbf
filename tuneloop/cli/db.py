"""``tuneloop db``: schema migrations of the configured database.

Exit codes: 0 done; 1 the migration itself failed or ``check`` found the schema out of date;
2 configuration, connection or unknown-revision errors. Errors are one line on stderr.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from tuneloop.cli import app
from tuneloop.cli.common import fail, settings_or_fail
from tuneloop.storage import DatabaseUnavailable, migrate

db_app = typer.Typer(help="Create and migrate the database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except (DatabaseUnavailable, migrate.MigrationError) as exc:
        fail(str(exc))
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        lines = str(orig if orig is not None else exc).strip().splitlines()
        fail(f"migration failed: {lines[0] if lines else type(exc).__name__}", code=1)


def _migrate(action: Callable[[str, str], None], revision: str, verb: str) -> None:
    url = settings_or_fail().resolved_database_url
    with _one_line_errors():
        action(url, revision)
        at = migrate.current(url)
    shown = make_url(url).render_as_string(hide_password=True)
    typer.echo(f"{verb} {shown} to revision {at or 'none'}")


@db_app.command()
def upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Migrate the database up to REVISION (default: the newest)."""
    _migrate(migrate.upgrade, revision, "upgraded")


@db_app.command()
def downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision; `base` drops every table.")],
) -> None:
    """Migrate the database down to REVISION (no default: a downgrade loses data)."""
    _migrate(migrate.downgrade, revision, "downgraded")


@db_app.command()
def current() -> None:
    """Print the revision the database is at (`none` if it was never migrated)."""
    url = settings_or_fail().resolved_database_url
    with _one_line_errors():
        at = migrate.current(url)
    typer.echo(at or "none")


@db_app.command()
def check() -> None:
    """Exit 0 if the database is at the newest revision and matches the models, else 1."""
    url = settings_or_fail().resolved_database_url
    with _one_line_errors():
        try:
            migrate.check_up_to_date(url)
        except migrate.MigrationError as exc:
            fail(str(exc), code=1)
    typer.echo("database schema is up to date")
