"""The models' schema with no rows, for a test, at a fraction of the cost of creating every
table (on 2 busy cores about a second per test on PostgreSQL and a tenth of one on SQLite, for
up to some 1,200 tests; ``bench/store_fixture_setup.py``).

SQLite: a copy of a file in which ``create_all`` made the tables once per session.

PostgreSQL: the first test creates the schema and records a fingerprint of the catalog. Each
later test drops the ``samples`` and ``sample_chunks`` partitions the previous one wrote,
checks the catalog against that fingerprint and, if it matches, deletes every row and
restarts every sequence: the database is then what ``create_all`` on an empty schema makes.
Anything else a test left (a table, a column, an index, a migration's ``alembic_version``)
changes the fingerprint, and the schema is dropped and created again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy import Connection, create_engine, text

from tuneloop.storage import make_engine
from tuneloop.storage.models import metadata
from tuneloop.storage.timeseries.partitions import CHUNKS_TABLE, PARENT_TABLE

# Every object of the public schema that the models or a test could add, change or remove.
_CATALOG = text(
    """
    SELECT md5(coalesce(string_agg(item, ';' ORDER BY item), '')) FROM (
        SELECT concat_ws(':', 'class', c.relname, c.relkind)
        FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
        UNION ALL
        SELECT concat_ws(
            ':', 'column', c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
            a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
        )
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL
        SELECT concat_ws(':', 'constraint', conrelid::regclass, conname, pg_get_constraintdef(oid))
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace
        UNION ALL
        SELECT concat_ws(':', 'index', indexdef) FROM pg_indexes WHERE schemaname = 'public'
        UNION ALL
        SELECT concat_ws(':', 'type', typname) FROM pg_type
        WHERE typnamespace = 'public'::regnamespace
        UNION ALL
        SELECT concat_ws(':', 'function', oid::regprocedure)
        FROM pg_proc WHERE pronamespace = 'public'::regnamespace
        UNION ALL
        SELECT concat_ws(':', 'trigger', t.tgrelid::regclass, t.tgname)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
        UNION ALL
        SELECT concat_ws(':', 'policy', polrelid::regclass, polname) FROM pg_policy
    ) AS catalog(item)
    """
)
_PARTITIONS = text(
    "SELECT format('%I', c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "WHERE i.inhparent = to_regclass(:parent)"
)
# ALTER SEQUENCE ... RESTART for every sequence of the schema, in one round trip.
_RESTART_SEQUENCES = text(
    "SELECT count(setval(s.seqrelid, s.seqstart, false)) FROM pg_sequence s "
    "JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = 'public'::regnamespace"
)

_fingerprints: dict[str, str] = {}
"""The catalog's fingerprint right after ``create_all``, per database URL."""


def reset_postgres(url: str) -> None:
    """Drop everything in the public schema: an empty database."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text("DROP SCHEMA public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


def models_schema(url: str) -> None:
    """The models' tables, empty, sequences restarted, in the database at ``url``."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            if _fingerprints.get(url) is not None and _emptied(connection, _fingerprints[url]):
                return
        reset_postgres(url)
        with engine.begin() as connection:
            metadata.create_all(connection)
            _fingerprints[url] = connection.execute(_CATALOG).scalar_one()
    finally:
        engine.dispose()


def _emptied(connection: Connection, fingerprint: str) -> bool:
    """Empty the tables if the schema is still the models' (partitions aside); False if not."""
    # Identifiers come from the catalog, quoted by format('%I'): no value of a test's in them.
    for parent in (PARENT_TABLE, CHUNKS_TABLE):
        for partition in connection.execute(_PARTITIONS, {"parent": parent}).scalars():
            connection.execute(text(f"DROP TABLE {partition}"))
    if connection.execute(_CATALOG).scalar_one() != fingerprint:
        return False
    # Every table in one round trip, children first (names from the models, quoted).
    quote = connection.dialect.identifier_preparer.format_table
    deletes = "; ".join(f"DELETE FROM {quote(t)}" for t in reversed(metadata.sorted_tables))
    connection.exec_driver_sql(deletes)
    connection.execute(_RESTART_SEQUENCES)
    return True


def sqlite_template(path: Path) -> Path:
    """A SQLite file at ``path`` with the models' tables, for :func:`copy_sqlite` to copy."""
    engine = make_engine(f"sqlite:///{path}")
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()  # the last connection checkpoints the WAL into the file
    assert not path.with_name(path.name + "-wal").exists(), "the template's WAL was left over"
    return path


def copy_sqlite(template: Path, path: Path) -> bool:
    """The template's tables at ``path`` if nothing is there yet; False if something is."""
    if path.exists():
        return False
    shutil.copyfile(template, path)
    return True
