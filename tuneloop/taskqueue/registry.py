"""The one list of periodic tasks, shared by Celery beat and the in-process runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuneloop.settings import Settings
from tuneloop.taskqueue import maintenance


@dataclass(frozen=True, slots=True)
class PeriodicTask:
    name: str
    """Celery task name, also used in logs."""
    func: Callable[[], None]
    """Takes nothing and re-reads the store, so a late or repeated run is harmless."""
    interval_s: float

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"{self.name}: interval_s must be > 0, got {self.interval_s}")


def periodic_tasks(settings: Settings) -> tuple[PeriodicTask, ...]:
    # Imported here: the alerts component imports the task runtime from this package.
    from alerts import tasks as alert_tasks

    every = settings.maintenance_interval_s
    return (
        PeriodicTask("tuneloop.maintenance.rollups", maintenance.run_rollups, every),
        PeriodicTask("tuneloop.maintenance.retention", maintenance.run_retention, every),
        PeriodicTask(
            "tuneloop.alerts.evaluate", alert_tasks.run_evaluation, settings.alerts_eval_interval_s
        ),
        PeriodicTask(
            "tuneloop.alerts.notify",
            alert_tasks.run_notifications,
            settings.alerts_notify_interval_s,
        ),
    )
