"""The dynamic batcher: requests wait in a bounded queue; one worker thread takes the first,
then up to ``max_batch_size - 1`` more, waiting at most ``max_delay_ms`` after the first
arrived, and runs the model once on the batch.

Both knobs are live: :meth:`DynamicBatcher.set_knobs` takes effect at the next batch. A full
queue refuses a request at once (:class:`QueueFull`, the server's 503) instead of letting
latency grow without bound.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Final

Knobs = dict[str, int]
KNOBS: Final = ("max_batch_size", "max_delay_ms")
MAX_BATCH_LIMIT: Final = 1024
MAX_DELAY_LIMIT_MS: Final = 10_000
IDLE_TICK_S: Final = 0.2


class QueueFull(RuntimeError):
    """The batcher holds ``max_queue`` requests already."""


@dataclass(frozen=True, slots=True)
class Batch:
    """What one model call served: its size and timing (for the step report and tests)."""

    number: int
    size: int
    first_wait_s: float
    """How long the batch's first request waited before the model ran."""
    compute_s: float


def check_knobs(knobs: dict[str, Any]) -> Knobs:
    """The two knobs as integers, or a ``ValueError`` that names the bad one."""
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown}; the knobs are {', '.join(KNOBS)}")
    checked: Knobs = {}
    for name, limit, low in (
        ("max_batch_size", MAX_BATCH_LIMIT, 1),
        ("max_delay_ms", MAX_DELAY_LIMIT_MS, 0),
    ):
        value = knobs.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= limit:
            raise ValueError(f"{name} must be an integer in [{low}, {limit}], got {value!r}")
        checked[name] = value
    return checked


class DynamicBatcher:
    """``run(inputs) -> outputs`` is the model on a list of inputs; ``on_batch`` hears of each
    batch after it ran (on the worker thread); ``at_boundary`` is called before each batch is
    gathered, where the server applies a new config released to it."""

    def __init__(
        self,
        run: Callable[[Sequence[Any]], Sequence[Any]],
        *,
        max_batch_size: int = 8,
        max_delay_ms: int = 5,
        max_queue: int = 1024,
        on_batch: Callable[[Batch], None] | None = None,
        at_boundary: Callable[[int], None] | None = None,
    ) -> None:
        knobs = check_knobs({"max_batch_size": max_batch_size, "max_delay_ms": max_delay_ms})
        self._run = run
        self._knobs = knobs
        self._max_queue = max_queue
        self._on_batch = on_batch
        self._at_boundary = at_boundary
        self._queue: deque[tuple[float, Any, Future[Any]]] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self.batches = 0
        self._worker = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self._worker.start()

    @property
    def knobs(self) -> Knobs:
        with self._cond:
            return dict(self._knobs)

    def set_knobs(self, **knobs: Any) -> Knobs:
        """Change either knob (checked); the next batch uses it. Returns the knobs now."""
        checked = check_knobs(knobs)
        with self._cond:
            self._knobs.update(checked)
            self._cond.notify_all()
            return dict(self._knobs)

    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def submit(self, item: Any) -> Future[Any]:
        """Queue one input; the future holds its output (or the model's exception)."""
        future: Future[Any] = Future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("the batcher is stopped")
            if len(self._queue) >= self._max_queue:
                raise QueueFull(f"{len(self._queue)} requests queued")
            self._queue.append((time.monotonic(), item, future))
            self._cond.notify_all()
        return future

    def stop(self, timeout_s: float = 5.0) -> None:
        """Finish the queued requests, then stop the worker."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._worker.join(timeout_s)

    def _gather(self) -> list[tuple[float, Any, Future[Any]]] | None:
        """The next batch: the oldest request and those arriving within its delay; empty when
        idle for ``IDLE_TICK_S`` (so a released config applies without traffic), ``None`` once
        stopped and drained."""
        with self._cond:
            if not self._queue and not self._stopped:
                self._cond.wait(IDLE_TICK_S)
            if not self._queue:
                return None if self._stopped else []
            first_at = self._queue[0][0]
            while True:
                size, delay_ms = self._knobs["max_batch_size"], self._knobs["max_delay_ms"]
                left = first_at + delay_ms / 1000 - time.monotonic()
                if len(self._queue) >= size or left <= 0 or self._stopped:
                    break
                self._cond.wait(left)
            return [self._queue.popleft() for _ in range(min(size, len(self._queue)))]

    def _loop(self) -> None:
        while True:
            if self._at_boundary is not None:
                self._at_boundary(self.batches)
            batch = self._gather()
            if batch is None:
                return
            if not batch:
                continue
            started = time.monotonic()
            try:
                outputs = self._run([item for _, item, _ in batch])
                if len(outputs) != len(batch):
                    raise RuntimeError(f"{len(outputs)} outputs for {len(batch)} inputs")
            except Exception as exc:  # the callers get it; the worker goes on
                for _, _, future in batch:
                    future.set_exception(exc)
                continue
            compute_s = time.monotonic() - started
            for (_, _, future), output in zip(batch, outputs, strict=True):
                future.set_result(output)
            self.batches += 1
            if self._on_batch is not None:
                self._on_batch(Batch(self.batches, len(batch), started - batch[0][0], compute_s))
