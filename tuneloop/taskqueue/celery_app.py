"""The Celery app, built from settings: Redis is both broker and result backend."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from celery import Celery, Task
from sqlalchemy.exc import OperationalError

from tuneloop.settings import Settings
from tuneloop.storage import DatabaseUnavailable
from tuneloop.taskqueue.registry import PeriodicTask, periodic_tasks

# Worth another try: the database or its network was briefly away.
RETRYABLE = (OperationalError, DatabaseUnavailable)


def create_app(settings: Settings) -> Celery:
    """A Celery app with every registered task and the beat schedule.

    Raises ``ValueError`` if ``settings.redis_url`` is not set.
    """
    if not settings.redis_url:
        raise ValueError("TUNELOOP_REDIS_URL is not set")
    app = Celery("tuneloop", broker=settings.redis_url, backend=settings.redis_url)
    tasks = periodic_tasks(settings)
    app.conf.update(
        # A task is acknowledged once it is done, so one lost with its worker runs again.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=3600,
        enable_utc=True,
        timezone="UTC",
        broker_connection_retry_on_startup=True,
        beat_schedule=beat_schedule(tasks),
    )
    app.conf.task_default_queue = settings.task_queue
    for task in tasks:
        if task.fan_out is None:
            _register(app, task.name, task.func)
        else:
            _register(
                app,
                task.name,
                _enqueue_each(_register(app, task.fan_out.name, task.fan_out.each), task),
            )
    return app


def _register(app: Celery, name: str, func: Callable[..., None]) -> Task:
    # Retried with backoff and jitter on a database that is briefly away; acks_late (above)
    # brings back a task whose worker died.
    task: Task = app.task(
        name=name,
        shared=False,
        autoretry_for=RETRYABLE,
        retry_backoff=True,
        retry_backoff_max=60,
        retry_jitter=True,
        max_retries=3,
    )(func)
    return task


def _enqueue_each(each: Task, periodic: PeriodicTask) -> Callable[[], None]:
    fan_out = periodic.fan_out
    assert fan_out is not None

    def enqueue() -> None:
        for item in fan_out.ids():
            # A per-item task not started within one interval is dropped: the next tick
            # enqueues it again with fresh state.
            each.apply_async(args=[item], expires=periodic.interval_s)

    enqueue.__name__ = periodic.name.rsplit(".", 1)[-1]
    return enqueue


def beat_schedule(tasks: Iterable[PeriodicTask]) -> dict[str, dict[str, Any]]:
    """Celery beat entries; a tick not started within one interval expires, since the next tick
    does the same work (a slow queue does not pile up stale runs)."""
    return {
        task.name: {
            "task": task.name,
            "schedule": task.interval_s,
            "options": {"expires": task.interval_s},
        }
        for task in tasks
    }
