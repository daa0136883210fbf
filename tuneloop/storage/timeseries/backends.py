"""The one place a process picks where its series live: the built-in store, or the
Prometheus-compatible TSDB of ``TUNELOOP_TSDB_URL``."""

from __future__ import annotations

from tuneloop.settings import Settings
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.query import Bind
from tuneloop.storage.timeseries.store_backend import StoreBackend


def open_backend(settings: Settings, bind: Bind) -> TimeSeriesBackend:
    """:class:`PrometheusBackend` if ``settings.tsdb_url`` is set, else :class:`StoreBackend`
    on ``bind`` (an engine, or a connection whose transaction reads join)."""
    remote = open_remote_backend(settings)
    return remote if remote is not None else StoreBackend(bind)


def open_remote_backend(settings: Settings) -> PrometheusBackend | None:
    """The configured TSDB, or ``None`` when series live in the database."""
    if not settings.tsdb_url:
        return None
    headers = dict(settings.tsdb_headers)
    if settings.tsdb_bearer_token is not None:
        headers["Authorization"] = f"Bearer {settings.tsdb_bearer_token.get_secret_value()}"
    return PrometheusBackend(
        settings.tsdb_url,
        write_url=settings.tsdb_write_url or None,
        headers=headers,
        timeout_s=settings.tsdb_timeout_s,
        project_label=settings.tsdb_project_label,
    )
