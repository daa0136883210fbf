"""The pipeline between sources and a sink: it groups points into per-series batches, keeps a
bounded buffer, and holds a failed batch for the next flush so a database blink loses nothing.
When the buffer is full it drops the newest points and counts them rather than grow."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from collector.points import Point
from collector.sinks.base import Sink
from tuneloop.storage.timeseries.types import SeriesBatch

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PipelineStats:
    received: int = 0
    written: int = 0
    rejected: int = 0
    dropped: int = 0
    flush_failures: int = 0


def to_batches(points: Iterable[Point]) -> list[SeriesBatch]:
    """Group points by (metric, labels) into one batch per series, keeping arrival order."""
    grouped: dict[tuple[str, tuple[tuple[str, str], ...]], list[Point]] = {}
    for point in points:
        key = (point.metric, tuple(sorted(point.labels.items())))
        grouped.setdefault(key, []).append(point)
    return [
        SeriesBatch(
            members[0].metric,
            dict(members[0].labels),
            [point.ts for point in members],
            [point.value for point in members],
            members[0].kind,
        )
        for members in grouped.values()
    ]


class Pipeline:
    def __init__(self, sink: Sink, *, max_buffered: int = 500_000) -> None:
        self._sink = sink
        self._max_buffered = max_buffered
        self._buffer: list[Point] = []
        self._lock = threading.Lock()
        self.stats = PipelineStats()

    def consume(self, points: Iterable[Point]) -> None:
        incoming = list(points)
        with self._lock:
            self.stats.received += len(incoming)
            room = max(self._max_buffered - len(self._buffer), 0)
            if len(incoming) > room:
                self.stats.dropped += len(incoming) - room
                incoming = incoming[:room]
            self._buffer.extend(incoming)

    def flush(self) -> bool:
        """Write everything buffered. Returns False (and keeps the points) if the sink failed."""
        with self._lock:
            pending, self._buffer = self._buffer, []
        if not pending:
            return True
        try:
            result = self._sink.write(to_batches(pending))
        except Exception:
            log.warning(
                "sink write failed; keeping %d points for the next flush",
                len(pending),
                exc_info=True,
            )
            with self._lock:
                self.stats.flush_failures += 1
                # Older points go first; what no longer fits is dropped and counted.
                merged = pending + self._buffer
                self.stats.dropped += max(len(merged) - self._max_buffered, 0)
                self._buffer = merged[: self._max_buffered]
            return False
        with self._lock:
            self.stats.written += result.samples_written
            self.stats.rejected += result.samples_rejected
        for rejection in result.rejected:
            log.warning(
                "rejected %d samples of %s: %s",
                rejection.samples,
                rejection.metric,
                rejection.reason,
            )
        return True
