"""Alembic environment for tuneloop, configured from code by :mod:`tuneloop.storage.migrate`.

``tuneloop db upgrade`` passes an open connection in ``config.attributes["connection"]`` so the
whole run shares its transaction; without one (plain ``alembic`` with a config that sets
``sqlalchemy.url``) an engine is made from the URL. New revisions:
``python -c 'from tuneloop.storage.migrate import make_revision as m; m(URL, "message")'``
against a database at head.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.engine import make_url

from tuneloop.storage.engine import make_engine
from tuneloop.storage.migrate import context_options


def _run_online(connection: Connection) -> None:
    context.configure(connection=connection, **context_options(connection.dialect.name))
    with context.begin_transaction():
        context.run_migrations()


def _run_offline(url: str) -> None:
    context.configure(
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **context_options(make_url(url).get_backend_name()),
    )
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    config = context.config
    url = config.get_main_option("sqlalchemy.url")
    given = config.attributes.get("connection")
    if isinstance(given, Connection):
        _run_online(given)
    elif url is None:
        raise RuntimeError("no database: set sqlalchemy.url or pass a connection")
    elif context.is_offline_mode():
        _run_offline(url)
    else:
        engine = make_engine(url)
        try:
            with engine.connect() as connection:
                _run_online(connection)
        finally:
            engine.dispose()


main()
