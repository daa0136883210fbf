"""What a running tuneloop process holds: its settings, its engine and its session factory."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from tuneloop.settings import Settings
from tuneloop.storage import check_database, make_engine, session_factory


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]

    @classmethod
    def open(cls, settings: Settings, *, check: bool = True) -> Runtime:
        """Connect to the configured database; raises ``DatabaseUnavailable`` if ``check``
        is set and it does not answer."""
        engine = make_engine(settings.resolved_database_url)
        if check:
            check_database(engine)
        return cls(settings=settings, engine=engine, sessions=session_factory(engine))

    def close(self) -> None:
        self.engine.dispose()
