"""Helpers shared by every CLI command."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from tuneloop import accounts, errors
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings, SettingsError, get_settings
from tuneloop.storage import DatabaseUnavailable, session_scope
from tuneloop.storage.models import Project


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"tuneloop: {message}", err=True)
    raise typer.Exit(code)


def settings_or_fail(**overrides: object) -> Settings:
    """The configured settings, with command-level flags applied on top."""
    from tuneloop.settings import configure, load_settings

    base = get_settings()
    given = {key: value for key, value in overrides.items() if value is not None}
    if not given:
        return base
    try:
        return configure(load_settings(**{**base.model_dump(exclude_unset=True), **given}))
    except SettingsError as exc:
        fail(str(exc))


def open_runtime(settings: Settings) -> Runtime:
    try:
        return Runtime.open(settings)
    except DatabaseUnavailable as exc:
        fail(str(exc))


@contextmanager
def db_session() -> Iterator[Session]:
    """A committed-on-success session; account and database errors end the command cleanly."""
    runtime = open_runtime(get_settings())
    try:
        with session_scope(runtime.sessions) as session:
            yield session
    except errors.PermanentError as exc:
        fail(str(exc), code=1)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[:1]
        fail(
            f"database error: {reason[0] if reason else type(exc).__name__} "
            "(is the schema up to date? run the migrations)"
        )
    finally:
        runtime.close()


def project_or_fail(session: Session, name: str) -> Project:
    project = accounts.get_project_by_name(session, name)
    if project is None:
        fail(f"project {name!r} does not exist (create it with: tuneloop project create {name})", 1)
    return project
