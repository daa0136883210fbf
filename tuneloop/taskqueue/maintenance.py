"""Store maintenance tasks: rollups, compaction and retention.

Each task takes no arguments, reads what it needs from the store and is idempotent, so Celery may
run it late, twice (``acks_late``) or not at all (an expired tick) without harm.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta

from tuneloop.runtime import Runtime
from tuneloop.settings import get_settings
from tuneloop.storage.types import utcnow

log = logging.getLogger(__name__)

_lock = threading.Lock()
_runtime: Runtime | None = None
_runtime_pid = 0


def task_runtime() -> Runtime:
    """The runtime tasks use, opened from the settings once per process.

    Rebuilt after a fork (a Celery prefork child must not share its parent's connections) and
    when the settings were replaced by ``configure``.
    """
    global _runtime, _runtime_pid
    settings = get_settings()
    with _lock:
        if _runtime is not None and _runtime_pid != os.getpid():
            _runtime.engine.dispose(close=False)  # the parent's connections stay the parent's
            _runtime = None
        if _runtime is not None and _runtime.settings is not settings:
            _runtime.close()
            _runtime = None
        if _runtime is None:
            # No connection check: a database that is down fails the task, which retries.
            _runtime = Runtime.open(settings, check=False)
            _runtime_pid = os.getpid()
        return _runtime


def close_task_runtime() -> None:
    """Close the cached runtime (on shutdown, and between tests)."""
    global _runtime
    with _lock:
        if _runtime is not None and _runtime_pid == os.getpid():
            _runtime.close()
        _runtime = None


def run_rollups() -> None:
    """Bring the 1-minute and 1-hour rollups up to date."""
    # Imported at run time so that registering the task does not load the time-series code.
    from tuneloop.storage.timeseries.rollups import update_rollups

    runtime = task_runtime()
    result = update_rollups(runtime.engine, now=utcnow())
    log.info("rollups updated: %s", result)


def run_compaction() -> None:
    """Compact the closed chunk spans of raw samples outside the hot window, and merge late
    samples into their chunks (after the rollups: only what they have read is compacted)."""
    from tuneloop.storage.timeseries.compaction import compact

    runtime = task_runtime()
    result = compact(runtime.engine, now=utcnow())
    log.info("compaction: %s", result)


def run_retention() -> None:
    """Drop raw samples and rollups older than their retention, and create the next samples
    partition ahead of time so writers do not all stop to create it when the day turns."""
    from tuneloop.storage.timeseries.partitions import ensure_partitions
    from tuneloop.storage.timeseries.retention import apply_retention

    runtime = task_runtime()
    settings = runtime.settings
    now = utcnow()
    result = apply_retention(
        runtime.engine,
        now=now,
        retention_days=settings.retention_days,
        rollup_retention_days=settings.rollup_retention_days,
        partition_days=settings.partition_days,
    )
    log.info("retention applied: %s", result)
    ahead = now + timedelta(days=settings.partition_days)
    with runtime.engine.begin() as connection:
        created = ensure_partitions(connection, now, ahead, settings.partition_days)
    if created:
        log.info("created samples partitions ahead of time: %s", ", ".join(created))
