"""Writes batches through the time-series contract, for a process whose series live in a
Prometheus-compatible TSDB (``TUNELOOP_TSDB_URL``). The TSDB applies its own limits; the
store's per-project series caps do not apply there."""

from __future__ import annotations

from collections.abc import Sequence

from collector.sinks.base import SinkUnavailable
from tuneloop.errors import Unavailable
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.columns import Batch
from tuneloop.storage.timeseries.types import WriteResult


class BackendSink:
    """The pipeline's sink for a :class:`TimeSeriesBackend`. Safe to share between threads
    when the backend is."""

    def __init__(self, backend: TimeSeriesBackend) -> None:
        self._backend = backend

    def write(self, project_id: int, batches: Sequence[Batch]) -> WriteResult:
        try:
            return self._backend.write(project_id, batches)
        except Unavailable as exc:
            # The pipeline spools and retries on this class alone; a refusal is permanent.
            raise SinkUnavailable(str(exc)) from exc
