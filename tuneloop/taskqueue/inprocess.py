"""The embedded default's task runner: periodic tasks on one background thread, no Redis."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from tuneloop.settings import Settings
from tuneloop.taskqueue.registry import PeriodicTask, periodic_tasks

log = logging.getLogger(__name__)


class InProcessRunner:
    """Runs each task every ``interval_s``, first one interval after :meth:`start`, as beat does.

    Tasks run one after another on one thread. A task that raises is logged and runs again at
    its next tick; ticks missed while another task ran are skipped, not caught up.
    """

    def __init__(
        self, tasks: Sequence[PeriodicTask], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tasks = tuple(tasks)
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_settings(cls, settings: Settings) -> InProcessRunner:
        return cls(periodic_tasks(settings))

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("InProcessRunner already started")
        self._thread = threading.Thread(target=self._loop, name="tuneloop-tasks", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the task now running, if any, waiting up to ``timeout`` seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("a periodic task is still running after %.0fs; leaving it", timeout)

    def __enter__(self) -> InProcessRunner:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _loop(self) -> None:
        start = self._clock()
        due = {task.name: start + task.interval_s for task in self.tasks}
        while self.tasks:
            wait = max(0.0, min(due.values()) - self._clock())
            if self._stop.wait(wait):
                return
            for task in self.tasks:
                if self._stop.is_set():
                    return
                if due[task.name] <= self._clock():
                    self._run(task)
                    due[task.name] += task.interval_s
                    finished = self._clock()
                    if due[task.name] <= finished:  # overran its interval: no back-to-back run
                        due[task.name] = finished + task.interval_s

    @staticmethod
    def _run(task: PeriodicTask) -> None:
        try:
            task.func()
        except Exception:
            log.exception("periodic task %s failed; it runs again at its next tick", task.name)
