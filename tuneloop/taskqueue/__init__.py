"""Background work: periodic maintenance tasks and where they run.

With ``TUNELOOP_REDIS_URL`` set, Celery runs them (``tuneloop beat`` schedules, ``tuneloop worker``
executes, see :mod:`tuneloop.taskqueue.celery_app`). Without it, the embedded default runs the same
tasks on a thread of the serving process (:mod:`tuneloop.taskqueue.inprocess`). Both read one
registry, :func:`tuneloop.taskqueue.registry.periodic_tasks`.
"""

from tuneloop.taskqueue.registry import PeriodicTask, periodic_tasks

__all__ = ["PeriodicTask", "periodic_tasks"]
