"""One fixture, ``subject``, yields each series backend in turn, as Optuna's storage tests run
one suite over every storage: the built-in store on SQLite and on PostgreSQL, and the
Prometheus backend on a real VictoriaMetrics and a real Prometheus (remote-write receiver on),
both started once per session.

The TSDBs are shared by every test, so each test gets project ids of its own (random 9-digit
numbers there; fresh rows in a fresh database for the store). Prometheus refuses samples older
than its head block allows and out-of-order ones: tests write recent data (:data:`T0` is 20 to
30 minutes ago, on a 10-minute boundary) and each series once, in time order.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, insert, select

from tests.fresh_store import copy_sqlite, models_schema
from tests.peers import flush_victoria_metrics, running_prometheus, running_victoria_metrics
from tuneloop.storage import make_engine
from tuneloop.storage.models import Project, samples
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.columns import Batch
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.store_backend import StoreBackend

BACKENDS = [
    "sqlite",
    "postgresql",
    "sqlite-compacted",
    "postgresql-compacted",
    "victoriametrics",
    "prometheus",
]
COMPACT_AT = datetime(2200, 1, 1, tzinfo=UTC)
"""The compacted layouts compact as if now were this: every chunk span written is closed."""

_now = datetime.now(UTC)
T0 = _now.replace(second=0, microsecond=0, minute=_now.minute // 10 * 10) - timedelta(minutes=20)
"""Start of every test's data: recent enough for Prometheus' head block, aligned to 10 min."""

EXACT = 1e-9
COUNTER_TOLERANCE = 0.05
"""Relative tolerance of rate, increase and histogram_quantile on a Prometheus-compatible TSDB:
PromQL extrapolates to the window's edges where the store pairs each window's first sample with
the one before it (tuneloop.storage.timeseries.backend). Everything else is exact."""


@dataclass
class Subject:
    name: str
    backend: TimeSeriesBackend
    projects: tuple[int, int]
    """Two projects of this test's own."""
    counter_rel: float
    _flush: str | None = field(default=None, repr=False)
    _compact: Engine | None = field(default=None, repr=False)

    @property
    def project(self) -> int:
        return self.projects[0]

    def write(self, batches: Iterable[Batch], project: int | None = None) -> None:
        result = self.backend.write(self.project if project is None else project, list(batches))
        assert not result.rejected, result.rejected
        self.settle()

    def settle(self) -> None:
        """Make what was written searchable now."""
        if self._flush is not None:
            flush_victoria_metrics(self._flush)
        if self._compact is not None:
            # Every sample written into chunks (late ones merged), so every read crosses them.
            compact(self._compact, hot_window=timedelta(0), now=COMPACT_AT, after_rollups=False)
            with self._compact.connect() as connection:
                left = connection.execute(select(func.count()).select_from(samples)).scalar()
            assert left == 0, f"{left} samples left raw"


@pytest.fixture(scope="session")
def victoria_metrics_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_victoria_metrics(tmp_path_factory.mktemp("victoria-metrics")) as url:
        yield url


@pytest.fixture(scope="session")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prometheus")
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}
    with running_prometheus(config, workdir, remote_write_receiver=True) as url:
        yield url


def _projects(engine: Engine) -> tuple[int, int]:
    with engine.begin() as connection:
        ids = [
            connection.execute(insert(Project).values(name=name)).inserted_primary_key
            for name in ("mine", "theirs")
        ]
    assert ids[0] is not None and ids[1] is not None
    return int(ids[0][0]), int(ids[1][0])


@pytest.fixture(params=BACKENDS)
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    name = request.param
    if name.removesuffix("-compacted") in ("sqlite", "postgresql"):
        if name.startswith("sqlite"):
            copy_sqlite(request.getfixturevalue("sqlite_models_file"), tmp_path / "tuneloop.db")
            url = f"sqlite:///{tmp_path / 'tuneloop.db'}"
            engine = make_engine(url)
        else:
            url = request.getfixturevalue("postgres_server_url")
            models_schema(url)
            engine = make_engine(url)
        try:
            compacted = engine if name.endswith("-compacted") else None
            yield Subject(name, StoreBackend(engine), _projects(engine), EXACT, _compact=compacted)
        finally:
            engine.dispose()
        return
    fixture = "victoria_metrics_url" if name == "victoriametrics" else "prometheus_url"
    tsdb_url: str = request.getfixturevalue(fixture)
    backend = PrometheusBackend(tsdb_url)
    first = random.randrange(100_000_000, 999_999_999)
    flush = tsdb_url if name == "victoriametrics" else None
    try:
        yield Subject(name, backend, (first, first + 1), COUNTER_TOLERANCE, flush)
    finally:
        backend.close()
