"""Migrations on real SQLite and real PostgreSQL: they build exactly the models' schema."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from typer.testing import CliRunner

from tuneloop.cli import _register_commands, app
from tuneloop.settings import configure, load_settings
from tuneloop.storage import make_engine, migrate
from tuneloop.storage.models import metadata

# The newest revision: the last of the numbered scripts, which form one chain.
HEAD = sorted(p.name for p in (migrate.migrations_dir() / "versions").glob("0*.py"))[-1][:4]

BOTH = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]
PARTITION_SQL = (
    "CREATE TABLE samples_p20260101 PARTITION OF samples "
    "FOR VALUES FROM ('2026-01-01') TO ('2026-01-02')"
)


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def schema_diff(url: str, **overrides: Any) -> list[Any]:
    """What autogenerate would write, with the options env.py uses."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            options = {**migrate.context_options(connection.dialect.name), **overrides}
            context = MigrationContext.configure(connection, opts=options)
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def execute(url: str, *statements: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


def relkind(connection: Connection, table: str) -> str:
    return str(
        connection.execute(
            text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table}
        ).scalar_one()
    )


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_upgrade_creates_every_table_of_the_models(empty_database_url: str) -> None:
    assert migrate.current(empty_database_url) is None

    migrate.upgrade(empty_database_url)

    assert tables(empty_database_url) == set(metadata.tables) | {"alembic_version"}
    assert migrate.current(empty_database_url) == migrate.head() == HEAD
    engine = make_engine(empty_database_url)
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            assert relkind(connection, "samples") == "p"  # partitioned
            assert relkind(connection, "samples_1m") == "r"
    engine.dispose()


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_downgrade_to_base_drops_everything_and_upgrade_works_again(
    empty_database_url: str,
) -> None:
    migrate.upgrade(empty_database_url)
    if empty_database_url.startswith("postgresql"):
        execute(empty_database_url, PARTITION_SQL)  # goes with its parent

    migrate.downgrade(empty_database_url, "base")

    assert tables(empty_database_url) <= {"alembic_version"}
    assert migrate.current(empty_database_url) is None

    migrate.upgrade(empty_database_url)
    assert tables(empty_database_url) == set(metadata.tables) | {"alembic_version"}


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_models_and_migrations_agree(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)

    assert schema_diff(empty_database_url) == []
    migrate.check_up_to_date(empty_database_url)


@pytest.mark.postgres
@pytest.mark.parametrize("empty_database_url", ["postgresql"], indirect=True)
def test_writer_created_partitions_are_not_a_diff(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    execute(empty_database_url, PARTITION_SQL)

    assert schema_diff(empty_database_url) == []
    migrate.check_up_to_date(empty_database_url)
    # The filter is what hides it: without it autogenerate would drop the partition.
    unfiltered = schema_diff(empty_database_url, include_object=None)
    dropped = [change[1].name for change in unfiltered if change[0] == "remove_table"]
    assert dropped == ["samples_p20260101"]


@pytest.mark.postgres
@pytest.mark.parametrize("empty_database_url", ["postgresql"], indirect=True)
def test_concurrent_upgrades_on_postgresql_take_turns(empty_database_url: str) -> None:
    # Processes, not threads: Alembic's ``op`` and ``context`` are process-wide proxies.
    script = "import sys; from tuneloop.storage.migrate import upgrade; upgrade(sys.argv[1])"
    runs = [
        subprocess.Popen([sys.executable, "-c", script, empty_database_url], stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=60)
        assert run.returncode == 0, stderr.decode()
    assert migrate.current(empty_database_url) == HEAD


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_a_wrong_timestamp_type_is_a_diff(empty_database_url: str) -> None:
    """compare_type is on and sees through UTCDateTime: a naive timestamp column is caught."""
    migrate.upgrade(empty_database_url)
    if empty_database_url.startswith("postgresql"):
        execute(
            empty_database_url,
            "ALTER TABLE rollup_state ALTER COLUMN watermark TYPE timestamp without time zone",
        )
    else:
        execute(
            empty_database_url,
            "DROP TABLE rollup_state",
            "CREATE TABLE rollup_state (resolution_s INTEGER NOT NULL, watermark DATETIME "
            "NOT NULL, CONSTRAINT pk_rollup_state PRIMARY KEY (resolution_s))",
        )

    diff = schema_diff(empty_database_url)

    assert len(diff) == 1
    (change,) = diff[0]  # modify_* changes come grouped per column
    assert change[:4] == ("modify_type", None, "rollup_state", "watermark")
    with pytest.raises(migrate.MigrationError, match=r"first modify_type rollup_state\.watermark:"):
        migrate.check_up_to_date(empty_database_url)


def test_unknown_revision_is_one_line(empty_database_url: str) -> None:
    with pytest.raises(migrate.MigrationError, match=r"^Can't locate revision .*'nope'$"):
        migrate.upgrade(empty_database_url, "nope")


def test_migrations_are_found_in_the_checkout() -> None:
    found = migrate.migrations_dir()
    assert found == Path(__file__).resolve().parents[1] / "migrations"
    assert (found / "versions" / "0001_initial.py").is_file()


# --------------------------------------------------------------------------- tuneloop db


@pytest.fixture
def cli() -> Iterator[CliRunner]:
    _register_commands()
    yield CliRunner()
    configure(load_settings())  # the CLI callback installed its own settings


def test_db_commands_on_a_sqlite_file(cli: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    flags = ["--database-url", url, "db"]

    upgraded = cli.invoke(app, [*flags, "upgrade"])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"to revision {HEAD}" in upgraded.stdout
    assert tables(url) == set(metadata.tables) | {"alembic_version"}

    assert cli.invoke(app, [*flags, "current"]).stdout.strip() == HEAD
    assert cli.invoke(app, [*flags, "check"]).exit_code == 0

    missing_revision = cli.invoke(app, [*flags, "downgrade"])
    assert missing_revision.exit_code == 2
    assert migrate.current(url) == HEAD

    downgraded = cli.invoke(app, [*flags, "downgrade", "base"])
    assert downgraded.exit_code == 0, downgraded.output
    assert cli.invoke(app, [*flags, "current"]).stdout.strip() == "none"

    out_of_date = cli.invoke(app, [*flags, "check"])
    assert out_of_date.exit_code == 1
    assert out_of_date.stderr.startswith("tuneloop: database is at revision none")


def test_db_upgrade_on_a_closed_port_fails_in_one_line(cli: CliRunner) -> None:
    result = cli.invoke(
        app, ["--database-url", "postgresql://tuneloop@127.0.0.1:1/tuneloop", "db", "upgrade"]
    )

    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tuneloop: cannot reach the database at postgresql")
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
