"""Forwards batches to a Prometheus-compatible TSDB over remote write.

The TSDB being unreachable (or answering 5xx or 429) is :class:`SinkUnavailable`, so the
pipeline spools and retries exactly as it does for the store; a 4xx answer is a permanent
rejection of that request's samples, counted and not retried (the remote-write spec).
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.sinks.base import SinkUnavailable
from tuneloop.storage.prometheus.remote_writer import RemoteWriter, RemoteWriteUnavailable
from tuneloop.storage.timeseries.columns import Batch
from tuneloop.storage.timeseries.types import WriteResult


class RemoteWriteSink:
    """The pipeline's sink for a remote-write destination. Safe to share between threads."""

    def __init__(self, writer: RemoteWriter) -> None:
        self.writer = writer

    def write(self, project_id: int, batches: Sequence[Batch]) -> WriteResult:
        try:
            return self.writer.write(project_id, batches)
        except RemoteWriteUnavailable as exc:
            raise SinkUnavailable(str(exc)) from exc
