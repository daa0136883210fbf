"""Helpers shared by every CLI command."""

from __future__ import annotations

from typing import NoReturn

import typer

from tuneloop.runtime import Runtime
from tuneloop.settings import Settings, SettingsError, get_settings
from tuneloop.storage import DatabaseUnavailable


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
