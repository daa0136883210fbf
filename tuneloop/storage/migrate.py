"""Schema migrations, run from code: no ``alembic.ini`` needed.

The migration scripts live in ``migrations/`` in a source checkout and in ``tuneloop/_migrations``
inside an installed wheel. ``migrations/env.py`` and the tests both configure Alembic through
:func:`context_options`, so what ``tuneloop db check`` compares is exactly what autogenerate sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.autogenerate.api import AutogenContext
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine
from sqlalchemy.schema import SchemaItem

import tuneloop
from tuneloop.storage.engine import check_database, make_engine
from tuneloop.storage.locks import LockName, advisory_lock
from tuneloop.storage.models import metadata
from tuneloop.storage.timeseries.partitions import CHUNKS_PREFIX, NAME_PREFIX
from tuneloop.storage.types import UTCDateTime


class MigrationError(Exception):
    """A migration could not run or the schema is not as expected; ``str()`` is one line."""


# --------------------------------------------------------------------------- shared Alembic rules


def include_object(
    obj: SchemaItem,
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: SchemaItem | None,
) -> bool:
    """Autogenerate filter: skip the partitions of ``samples`` and ``sample_chunks`` (and so
    their indexes). The store creates them at run time, so they are not in the metadata and are
    not tables to drop."""
    is_partition = (
        type_ == "table"
        and reflected
        and compare_to is None
        and name is not None
        and name.startswith((NAME_PREFIX, CHUNKS_PREFIX))
    )
    return not is_partition


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render tuneloop's TypeDecorator by name with its import, not as a dotted module path."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        autogen_context.imports.add("from tuneloop.storage.types import UTCDateTime")
        return "UTCDateTime()"
    return False


def context_options(dialect_name: str) -> dict[str, Any]:
    """Options for ``context.configure``/``MigrationContext.configure`` on ``dialect_name``."""
    return {
        "target_metadata": metadata,
        "include_object": include_object,
        "render_item": render_item,
        "compare_type": True,
        # SQLite cannot ALTER most things; batch mode copies the table instead.
        "render_as_batch": dialect_name == "sqlite",
    }


# --------------------------------------------------------------------------- configuration


def migrations_dir() -> Path:
    """The migration scripts: inside the installed wheel, else next to the package."""
    package = Path(tuneloop.__file__).resolve().parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise MigrationError(f"migration scripts not found in {package / '_migrations'} or beside it")


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for ``url`` (a resolved SQLAlchemy URL) without any ini file."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        # Config values go through ConfigParser interpolation: a %-escaped password needs %%.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@contextmanager
def _engine(url: str) -> Iterator[Engine]:
    engine = make_engine(url)
    try:
        check_database(engine)
        yield engine
    finally:
        engine.dispose()


def _run(url: str, action: str, revision: str) -> None:
    with _engine(url) as engine, engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            # A batch migration drops and re-creates tables; with foreign keys on, SQLite would
            # cascade that drop into child rows. The pragma only works outside a transaction.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        with connection.begin():
            if not sqlite:
                # Two processes migrating at once: the second waits, then finds nothing to do.
                advisory_lock(connection, LockName.MIGRATIONS, key=None)
            config = alembic_config(url)
            config.attributes["connection"] = connection
            if action == "upgrade":
                command.upgrade(config, revision)
            else:
                command.downgrade(config, revision)
            if sqlite:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").first()
                if broken is not None:
                    raise MigrationError(f"migration left a broken foreign key in {broken[0]}")


def _run_or_explain(url: str, action: str, revision: str) -> None:
    try:
        _run(url, action, revision)
    except CommandError as exc:
        raise MigrationError(str(exc).strip().splitlines()[0]) from None


# --------------------------------------------------------------------------- commands


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``, all in one transaction where the
    backend allows. Raises ``DatabaseUnavailable`` or :class:`MigrationError`."""
    _run_or_explain(url, "upgrade", revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the database at ``url`` down to ``revision`` (``base``: drop everything)."""
    _run_or_explain(url, "downgrade", revision)


def head() -> str | None:
    """The newest revision the code knows."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _current(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection)
    return context.get_current_revision()


def current(url: str) -> str | None:
    """The revision the database at ``url`` is at; ``None`` if it was never migrated."""
    with _engine(url) as engine, engine.connect() as connection:
        return _current(connection)


def check_up_to_date(url: str) -> None:
    """Raise :class:`MigrationError` unless the database is at the newest revision and the
    models match it (a model change without a migration is caught here too)."""
    expected = head()
    with _engine(url) as engine, engine.connect() as connection:
        at = _current(connection)
        if at != expected:
            raise MigrationError(
                f"database is at revision {at or 'none'}, the code expects {expected}: "
                "run `tuneloop db upgrade`"
            )
        context = MigrationContext.configure(
            connection, opts=context_options(connection.dialect.name)
        )
        diff = compare_metadata(context, metadata)
    if diff:
        raise MigrationError(
            f"the models differ from the migrations in {len(diff)} place(s), first "
            f"{_describe(diff[0])}: add a migration"
        )


def _describe(change: Any) -> str:
    """``('modify_type', None, 'jobs', 'name', ...)`` -> ``modify_type jobs.name``."""
    if isinstance(change, list):  # changes to one column come grouped
        change = change[0]
    kind, *parts = change
    names = [getattr(part, "name", part) for part in parts]
    return f"{kind} {'.'.join(name for name in names if isinstance(name, str))}"


def make_revision(url: str, message: str, rev_id: str | None = None) -> None:
    """Write a new migration script autogenerated from the models against the database at
    ``url`` (which must be at head), then lint and format it. For developers, on a checkout."""
    with _engine(url) as engine, engine.connect() as connection:
        config = alembic_config(url)
        config.attributes["connection"] = connection
        config.set_section_option("post_write_hooks", "hooks", "format, lint")
        for name, args in (("lint", "check --fix"), ("format", "format")):
            config.set_section_option("post_write_hooks", f"{name}.type", "module")
            config.set_section_option("post_write_hooks", f"{name}.module", "ruff")
            config.set_section_option(
                "post_write_hooks", f"{name}.options", f"{args} REVISION_SCRIPT_FILENAME"
            )
        command.revision(config, message=message, autogenerate=True, rev_id=rev_id)
