"""The pipeline between sources (or the OTLP receiver) and the store.

``submit(project_id, batches)`` is all or nothing: every batch is accepted, or
:class:`PipelineFull` is raised and nothing is kept. From acceptance on, a sample is never lost:

* **Normal**: accepted batches wait in a bounded in-memory queue (``queue_max_samples``). A
  flusher thread writes them when ``batch_max_samples`` are queued or the oldest has waited
  ``flush_interval_s``, merging each project's queued batches into one write.
* **Spooling**: when a write fails because the store is unreachable (the sink raises
  :class:`SinkUnavailable`), the batches being written and everything queued go to the on-disk
  spool, in order, and so does every new submission (fsync'ed before ``submit`` returns) as
  long as the spool holds anything, so that order is kept. The flusher replays the spool oldest
  first, retrying with exponential backoff and jitter, and returns to normal once it is empty.
  If the spool is full (or there is none), submissions wait in memory behind it; only when
  both are full does ``submit`` raise :class:`PipelineFull`.

Invariant: whatever is in the spool is older than whatever is in the memory queue.

**Durable** (``PipelineConfig.durable``, what ``tuneloop up`` does unless told otherwise): the
spool is also the write-ahead log of every submission. ``submit`` writes the submission to it
and returns only once it is fsync'ed, many concurrent submissions sharing one fsync
(:mod:`collector.wal`); the flusher writes from memory as above and then moves the spool's ack
past what it wrote, so the log is truncated as the store catches up. When the store is
unreachable the memory queue is simply dropped (the log holds it) and replay starts at the
ack; a full log refuses submissions instead of holding them in memory. After a crash, the next
start replays what lies past the ack: at least once, never lost.

Permanent failures are counted and never retried: the store's rejections (bad input, series
cap) and any non-connection exception from the sink. In normal mode the queue lives in memory
only (up to ``flush_interval_s`` of data); ``stop()`` drains it to the store or to the spool.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from collector.points import samples_in
from collector.relabel import Relabeler
from collector.selfmetrics import CollectorMetrics
from collector.sinks.base import Sink, SinkUnavailable
from collector.spool import Position, Spool, SpoolFull
from collector.spool_format import Encoded, encode_record
from collector.wal import GroupCommit
from tuneloop.backoff import Backoff
from tuneloop.errors import Unavailable
from tuneloop.storage.timeseries.columns import Batch

log = logging.getLogger(__name__)

STOPPED_RETRY_AFTER_S = 5.0
"""Retry-After given while the process is shutting down (another instance may take over)."""


class PipelineFull(Unavailable):
    """Nothing of the submission was kept; try again after ``retry_after_s`` seconds (what an
    HTTP receiver sends as ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    batch_max_samples: int = 50_000
    """Flush as soon as this many samples are queued; also the most one write carries."""
    flush_interval_s: float = 1.0
    """Flush when the oldest queued sample has waited this long."""
    queue_max_samples: int = 500_000
    """Samples held in memory at most (one larger submission is let in when it is empty)."""
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    """Backoff between attempts to reach an unreachable store."""
    durable: bool = False
    """Acknowledge a submission only once it is on disk in the spool (see the module doc)."""

    def __post_init__(self) -> None:
        if self.batch_max_samples < 1 or self.queue_max_samples < 1:
            raise ValueError("batch_max_samples and queue_max_samples must be >= 1")
        if self.flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be positive")


@dataclass(frozen=True, slots=True)
class PipelineStatus:
    queued_samples: int
    spooling: bool
    """The store was unreachable and data is waiting in the spool (or behind it)."""
    spool_bytes: int
    running: bool


@dataclass(slots=True)
class _Item:
    project_id: int
    batches: list[Batch]
    samples: int
    at: float  # monotonic time it was queued
    end: Position | None = None  # where its record ends in the write-ahead log (durable)


class Pipeline:
    """See the module docstring. ``start()`` runs the flusher thread; ``stop()`` drains."""

    def __init__(
        self,
        sink: Sink,
        *,
        config: PipelineConfig | None = None,
        spool: Spool | None = None,
        relabeler: Relabeler | None = None,
        metrics: CollectorMetrics | None = None,
    ) -> None:
        self._sink = sink
        self.config = config or PipelineConfig()
        self._spool = spool
        self._log = GroupCommit(spool) if spool is not None and self.config.durable else None
        self._relabeler = relabeler or Relabeler()
        self.metrics = metrics or CollectorMetrics()
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._queued = 0
        self._spooling = False
        self._spool_full = False
        self._retry = Backoff(self.config.retry_initial_s, self.config.retry_max_s)
        self._next_attempt = 0.0
        self._state = "new"  # new -> running -> stopping -> stopped
        self._thread: threading.Thread | None = None
        self._stop_deadline = 0.0

    # ------------------------------------------------------------------ public

    @property
    def registry(self) -> CollectorRegistry:
        """Where the pipeline's metrics live."""
        return self.metrics.registry

    def status(self) -> PipelineStatus:
        with self._cond:
            return PipelineStatus(
                queued_samples=self._queued,
                spooling=self._spooling,
                spool_bytes=self._spool.pending_bytes if self._spool is not None else 0,
                running=self._state == "running",
            )

    def submit(self, project_id: int, batches: Sequence[Batch]) -> None:
        """All or nothing: either every batch is accepted (queued in memory or spooled to
        disk, and from then on never lost) or :class:`PipelineFull` is raised and nothing is
        kept. The pipeline owns the batches from here: do not change them afterwards."""
        received = samples_in(batches)
        self.metrics.received.inc(received)
        kept, dropped = self._relabeler.apply(batches)
        self.metrics.reject("relabel_drop", dropped)
        # Without rules the batches pass as they are: no need to count them again.
        samples = samples_in(kept) if self._relabeler else received
        if not samples:
            return
        item = _Item(project_id, kept, samples, time.monotonic())
        # Encoded outside the lock: the only part of logging that costs per sample.
        encoded = encode_record(project_id, kept) if self._log is not None else None
        with self._cond:
            if self._state in ("stopping", "stopped"):
                self._refuse(item, "the pipeline is stopping", STOPPED_RETRY_AFTER_S)
            if encoded is not None:
                ticket = self._log_item(item, encoded)
            else:
                if self._spooling and not self._queue and self._spool_item(item):
                    return
                self._check_room(item)
                self._enqueue(item)
                return
        if ticket:
            self._await_durable(ticket)

    def _check_room(self, item: _Item) -> None:
        """Refuse ``item`` if the memory queue cannot take it. Lock held."""
        if not self._queued or self._queued + item.samples <= self.config.queue_max_samples:
            return
        if self._spooling:
            # The store's next try: nothing frees before it.
            retry_after = self._next_attempt - item.at
            reason = "the store is unreachable and the spool and memory queue are full"
        else:
            # The store is as far behind as the oldest queued item is old: a client
            # told to come back sooner would only be refused again.
            retry_after = item.at - self._queue[0].at if self._queue else 0.0
            reason = "the memory queue is full"
        retry_after = max(retry_after, self.config.flush_interval_s)
        self._refuse(item, reason, retry_after)

    def _log_item(self, item: _Item, encoded: Encoded) -> int:
        """Write ``item`` to the write-ahead log, and queue it in memory unless the store is
        down (the log alone then holds it); its ticket for the group commit (0: nothing was
        written, the encoder rejected every batch). Lock held."""
        assert self._spool is not None and self._log is not None
        if not self._spooling:
            self._check_room(item)
        if encoded.samples:
            try:
                item.end = self._spool.write(encoded)
            except SpoolFull as exc:
                wait = self._next_attempt - item.at if self._spooling else 0.0
                wait = max(wait, self.config.flush_interval_s)
                self._refuse(item, f"the write-ahead log cannot take it: {exc}", wait)
        if self._spooling:
            self.metrics.spooled.inc(encoded.samples)
            self.metrics.count_rejections(encoded.rejected)
            self._update_gauges()
        else:
            self._enqueue(item)  # the store reports the rejections when it is written
        return self._log.written() if encoded.samples else 0

    def _await_durable(self, ticket: int) -> None:
        assert self._log is not None
        try:
            self._log.wait(ticket)
        except OSError as exc:
            # It may still be stored: a client that retries can make a duplicate, not a loss.
            log.error("cannot fsync the write-ahead log: %s", exc)
            retry = self.config.flush_interval_s
            raise PipelineFull(f"cannot make the samples durable: {exc}", retry) from exc

    def start(self) -> None:
        """Replay what an earlier run left in the spool, then flush in the background."""
        with self._cond:
            if self._state != "new":
                raise RuntimeError(f"cannot start a pipeline that is {self._state}")
            self._state = "running"
            if self._spool is not None and self._spool.open():
                self._spooling = True
                self._next_attempt = 0.0
            self._update_gauges()
        self._thread = threading.Thread(target=self._run, name="tuneloop-pipeline", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Write what is waiting (spool first, then memory) while the store answers, for at
        most ``timeout_s``; whatever is left goes to the spool for the next run. After this,
        ``submit`` raises :class:`PipelineFull`."""
        with self._cond:
            if self._state in ("stopping", "stopped"):
                return
            started = self._state == "running"
            self._state = "stopping"
            self._stop_deadline = time.monotonic() + timeout_s
            self._cond.notify_all()
        if started and self._thread is not None:
            self._thread.join(timeout_s + 5.0)
            if self._thread.is_alive():
                log.error("the pipeline did not finish draining in %.0fs", timeout_s + 5.0)
                return
        else:
            self._drain()
        with self._cond:
            self._state = "stopped"

    # ------------------------------------------------------------------ submit helpers

    def _refuse(self, item: _Item, reason: str, retry_after_s: float) -> None:
        self.metrics.reject("queue_full", item.samples)
        retry_after = min(max(retry_after_s, 1.0), self.config.retry_max_s)
        raise PipelineFull(f"{reason}; retry in {retry_after:.0f}s", retry_after)

    def _enqueue(self, item: _Item) -> None:
        was_empty = not self._queue
        self._queue.append(item)
        self._queued += item.samples
        self._update_gauges()
        if was_empty or self._queued >= self.config.batch_max_samples:
            self._cond.notify_all()

    def _spool_item(self, item: _Item) -> bool:
        """Append ``item`` to the spool (caller holds the lock); ``False`` if it is full."""
        if self._spool is None:
            return False
        try:
            encoded = self._spool.append(item.project_id, item.batches)
        except SpoolFull as exc:
            if not self._spool_full:  # once per episode, not once per submission
                log.warning("cannot spool: %s; holding samples in memory", exc)
                self._spool_full = True
            return False
        self._spool_full = False
        self.metrics.spooled.inc(encoded.samples)
        self.metrics.count_rejections(encoded.rejected)
        self._update_gauges()
        return True

    def _update_gauges(self) -> None:
        self.metrics.queue_depth.set(self._queued)
        if self._spool is not None:
            self.metrics.spool_bytes.set(self._spool.pending_bytes)

    # ------------------------------------------------------------------ flusher

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._state == "running" and (wait := self._wait_s()) != 0.0:
                    self._cond.wait(wait)
                if self._state != "running":
                    break
                spooling = self._spooling
            try:
                if spooling:
                    self._replay_once()
                else:
                    self._flush_once()
            except Exception:  # never let the flusher die: the data would sit forever
                log.exception("unexpected error in the pipeline flusher; retrying")
                with self._cond:
                    self._store_down()
        self._drain()

    def _wait_s(self) -> float | None:
        """Seconds until there is work (0: now, ``None``: until notified). Lock held."""
        now = time.monotonic()
        if self._spooling:
            return max(self._next_attempt - now, 0.0)
        if not self._queue:
            return None
        if self._queued >= self.config.batch_max_samples:
            return 0.0
        return max(self._queue[0].at + self.config.flush_interval_s - now, 0.0)

    def _take(self) -> list[_Item]:
        """Oldest queued items up to ``batch_max_samples`` (at least one). Lock held."""
        taken: list[_Item] = []
        samples = 0
        while self._queue and (
            not taken or samples + self._queue[0].samples <= self.config.batch_max_samples
        ):
            item = self._queue.popleft()
            taken.append(item)
            samples += item.samples
        self._queued -= samples
        self._update_gauges()
        return taken

    def _flush_once(self) -> bool:
        """Write one batch of the memory queue; ``False`` if the store was unreachable (the
        unwritten items then went to the spool or back to the head of the queue)."""
        with self._cond:
            items = self._take()
        if not items:
            return True
        unwritten = self._write_items(items)
        if not unwritten:
            ends = [item.end for item in items if item.end is not None]
            if ends and self._spool is not None:
                self._spool.ack_to(ends[-1])  # the log is truncated as the store catches up
            with self._cond:
                self._retry.reset()
                self._update_gauges()
            return True
        with self._cond:
            self._queue.extendleft(reversed(unwritten))
            self._queued += sum(item.samples for item in unwritten)
            self._store_down()
        return False

    def _write_items(self, items: list[_Item]) -> list[_Item]:
        """Write ``items`` with one write per project; return those not written because the
        store became unreachable (in their original order)."""
        projects: dict[int, list[Batch]] = {}
        for item in items:
            projects.setdefault(item.project_id, []).extend(item.batches)
        written: set[int] = set()
        for project_id, batches in projects.items():
            try:
                self._write(project_id, batches)
            except SinkUnavailable as exc:
                log.warning("the store is unreachable (%s); spooling", exc)
                return [item for item in items if item.project_id not in written]
            written.add(project_id)
        return []

    def _write(self, project_id: int, batches: Sequence[Batch]) -> None:
        """One write; counts what was written and rejected. Raises only SinkUnavailable."""
        started = time.perf_counter()
        try:
            result = self._sink.write(project_id, batches)
        except SinkUnavailable:
            self.metrics.write_duration.observe(time.perf_counter() - started)
            raise
        except Exception:
            self.metrics.write_duration.observe(time.perf_counter() - started)
            samples = samples_in(batches)
            log.exception(
                "permanent error writing %d samples of project %d; dropping them",
                samples,
                project_id,
            )
            self.metrics.reject("write_failed", samples)
            return
        self.metrics.write_duration.observe(time.perf_counter() - started)
        self.metrics.written.inc(result.samples_written)
        self.metrics.count_rejections(result.rejected)

    def _store_down(self) -> None:
        """Enter (or stay in) spooling mode: move the memory queue to the spool, in order,
        as far as it fits, and schedule the next attempt. Lock held."""
        self._spooling = True
        self._spool_memory()
        self._next_attempt = time.monotonic() + self._retry.next_delay()

    def _spool_memory(self) -> None:
        """Move the memory queue to the spool, oldest first, as far as it fits. Lock held."""
        if self._log is not None:
            # Already in the log past its ack: replay finds it there.
            self._queue.clear()
            self._queued = 0
        while self._queue and self._spool_item(self._queue[0]):
            self._queued -= self._queue.popleft().samples
        self._update_gauges()

    def _replay_once(self) -> bool:
        """Replay one group from the spool, or, once it is empty, one batch of the memory
        queue behind it; back to normal when both are empty. ``False`` if the store was
        unreachable (the next attempt is then scheduled)."""
        group = (
            self._spool.read_group(self.config.batch_max_samples)
            if self._spool is not None
            else None
        )
        if group is not None:
            try:
                self._write(group.project_id, group.batches)
            except SinkUnavailable as exc:
                log.info("the store is still unreachable (%s)", exc)
                with self._cond:
                    self._store_down()
                return False
            assert self._spool is not None
            self._spool.ack(group)
            with self._cond:
                self._retry.reset()
                self._update_gauges()
            return True
        with self._cond:
            if self._spool is not None and not self._spool.empty:
                return True  # appended meanwhile; read it on the next round
            if not self._queue:
                # Nothing waits anywhere: new submissions may go to memory again.
                self._spooling = False
                self._retry.reset()
                log.info("the store is reachable again; the spool is replayed")
                return True
        return self._flush_once()

    def _drain(self) -> None:
        """At stop: write what waits while the store answers and time remains, then spool
        the rest of memory (or, if that fails too, count it as lost)."""
        while time.monotonic() < self._stop_deadline:
            with self._cond:
                spooling, pending = self._spooling, bool(self._queue)
                spool_empty = self._spool is None or self._spool.empty
            if not pending and spool_empty:
                break
            # A failed attempt has already moved memory to the spool and set the next one.
            if not (self._replay_once() if spooling else self._flush_once()):
                with self._cond:
                    wait = min(self._next_attempt, self._stop_deadline) - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
        with self._cond:
            self._spool_memory()
            lost = self._queued
            if lost:
                log.error("stopping with %d samples that could not be stored or spooled", lost)
                self.metrics.reject("shutdown_lost", lost)
                self._queue.clear()
                self._queued = 0
            self._update_gauges()
            if self._spool is not None:
                if not self._spool.empty:
                    log.warning(
                        "%d bytes stay in the spool %s; they are replayed at the next start",
                        self._spool.pending_bytes,
                        self._spool.slot,
                    )
                self._spool.close()
