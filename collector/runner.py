"""Polls every source on an interval and flushes the pipeline, in a background thread.

A source that raises is logged and counted; it never stops the others or the runner.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime

from collector.pipeline import Pipeline
from collector.sources.base import Source

log = logging.getLogger(__name__)


class CollectorRunner:
    def __init__(self, sources: Sequence[Source], pipeline: Pipeline, *, interval_s: float):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._sources = list(sources)
        self._pipeline = pipeline
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.source_errors: dict[str, int] = {source.name: 0 for source in self._sources}

    def collect_once(self) -> None:
        now = datetime.now(UTC)
        for source in self._sources:
            try:
                self._pipeline.consume(source.collect(now))
            except Exception:
                self.source_errors[source.name] += 1
                log.exception("source %s failed; continuing with the others", source.name)
        self._pipeline.flush()

    def start(self) -> None:
        for source in self._sources:
            source.start()
        self._thread = threading.Thread(target=self._loop, name="tuneloop-collector", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._pipeline.flush()
        for source in self._sources:
            try:
                source.shutdown()
            except Exception:
                log.exception("source %s failed to shut down", source.name)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.collect_once()
            self._stop.wait(self._interval_s)
