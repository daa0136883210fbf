"""Polls every source on its own interval, each in its own thread, into a shared pipeline.

A source that raises (GPU gone, exporter down) is reported on the status board and in the
metrics, shut down, and started again after an exponential backoff with jitter, while the
other sources go on: a hung NVML call blocks only its own thread. A full pipeline is not the
source's fault: that poll is dropped (the pipeline counts it) and polling goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from collector.fanout import WritePipeline
from collector.pipeline import PipelineFull
from collector.points import to_batches
from collector.sources.base import Source
from collector.status import SourceStatus, StatusBoard
from tuneloop.backoff import Backoff

log = logging.getLogger(__name__)

RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 60.0


class CollectorRunner:
    def __init__(
        self,
        sources: Sequence[Source],
        pipeline: WritePipeline,
        project_id: int,
        *,
        interval_s: float,
        intervals: Mapping[str, float] | None = None,
        board: StatusBoard | None = None,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        """``interval_s`` applies to every source unless ``intervals`` names another for it."""
        names = [source.name for source in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names}")
        self._intervals = {name: (intervals or {}).get(name, interval_s) for name in names}
        if any(interval <= 0 for interval in self._intervals.values()):
            raise ValueError("poll intervals must be positive")
        self._sources = list(sources)
        self._pipeline = pipeline
        self._project_id = project_id
        self._metrics = pipeline.metrics
        self.board = board if board is not None else StatusBoard()
        self._retry = (retry_initial_s, retry_max_s)
        Backoff(*self._retry)  # checks them here rather than in each thread
        self._started: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        for name in names:
            self.board.register(name)

    def status(self) -> list[SourceStatus]:
        return [s for s in self.board.snapshot() if s.name in self._intervals]

    def poll(self, source: Source) -> bool:
        """Poll ``source`` once into the pipeline; ``False`` if the source failed."""
        now = datetime.now(UTC)
        try:
            if source.name not in self._started:
                source.start()
                self._started.add(source.name)
            points = list(source.collect(now))
        except Exception as exc:
            self._failed(source, exc)
            return False
        self.board.succeeded(source.name, now)
        self._metrics.source_up.labels(source=source.name).set(1)
        if points:
            try:
                self._pipeline.submit(self._project_id, to_batches(points))
            except PipelineFull as exc:
                log.warning("dropping a poll of %s: %s", source.name, exc)
        return True

    def collect_once(self) -> None:
        """Poll every source once, one after the other (tests and one-shot use)."""
        for source in self._sources:
            self.poll(source)

    def start(self) -> None:
        for source in self._sources:
            thread = threading.Thread(
                target=self._loop, args=(source,), name=f"tuneloop-source-{source.name}"
            )
            thread.daemon = True
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling and shut every source down. The pipeline is the caller's to stop."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
            if thread.is_alive():
                log.error("%s did not stop within %.0fs", thread.name, timeout_s)
        for source in self._sources:
            if source.name in self._started:
                self._shutdown(source)

    def _loop(self, source: Source) -> None:
        backoff = Backoff(*self._retry)
        interval = self._intervals[source.name]
        while not self._stop.is_set():
            if self.poll(source):
                backoff.reset()
                delay = interval
            else:
                delay = backoff.next_delay()
            self._stop.wait(delay)

    def _failed(self, source: Source, exc: Exception) -> None:
        message = (str(exc).strip().splitlines() or [""])[0] or type(exc).__name__
        status = self.board.failed(source.name, f"{type(exc).__name__}: {message}")
        self._metrics.source_errors.labels(source=source.name).inc()
        self._metrics.source_up.labels(source=source.name).set(0)
        # The whole traceback once per outage, then one line per retry.
        log.warning(
            "source %s failed (%d in a row): %s; the others go on",
            source.name,
            status.consecutive_failures,
            message,
            exc_info=status.consecutive_failures == 1,
        )
        # Start it afresh next time: a GPU that fell off the bus needs new handles.
        if source.name in self._started:
            self._shutdown(source)

    def _shutdown(self, source: Source) -> None:
        self._started.discard(source.name)
        try:
            source.shutdown()
        except Exception:
            log.exception("source %s failed to shut down", source.name)
