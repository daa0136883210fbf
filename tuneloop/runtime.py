"""What a running tuneloop process holds: its settings, its engine and its session factory,
and the Prometheus-compatible TSDB its series live in when ``TUNELOOP_TSDB_URL`` is set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from tuneloop.settings import Settings
from tuneloop.storage import check_database, make_engine, session_factory

if TYPE_CHECKING:
    from tuneloop.storage.prometheus.backend import PrometheusBackend
    from tuneloop.storage.timeseries.backend import TimeSeriesBackend
    from tuneloop.storage.timeseries.query import Bind


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    remote_series: PrometheusBackend | None = None
    """The configured TSDB (one connection pool per process); ``None``: the built-in store."""

    @classmethod
    def open(cls, settings: Settings, *, check: bool = True) -> Runtime:
        """Connect to the configured database; raises ``DatabaseUnavailable`` if ``check``
        is set and it does not answer."""
        # Imported here: most commands never read series, and start faster without it.
        from tuneloop.storage.timeseries.backends import open_remote_backend

        engine = make_engine(settings.resolved_database_url)
        if check:
            check_database(engine)
        return cls(
            settings=settings,
            engine=engine,
            sessions=session_factory(engine),
            remote_series=open_remote_backend(settings),
        )

    def series(self, bind: Bind | None = None) -> TimeSeriesBackend:
        """Where this process reads and writes series: the TSDB if one is configured, else the
        store through ``bind`` (a connection whose transaction reads join; default: the
        engine)."""
        from tuneloop.storage.timeseries.store_backend import StoreBackend

        if self.remote_series is not None:
            return self.remote_series
        return StoreBackend(self.engine if bind is None else bind)

    def close(self) -> None:
        if self.remote_series is not None:
            self.remote_series.close()
        self.engine.dispose()
