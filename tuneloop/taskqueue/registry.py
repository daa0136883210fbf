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
    # Imported here: the actuator's task pulls in the API's services, which import this module.
    from actuators.tasks import run_reconcile

    every = settings.maintenance_interval_s
    return (
        PeriodicTask("tuneloop.maintenance.rollups", maintenance.run_rollups, every),
        PeriodicTask("tuneloop.maintenance.retention", maintenance.run_retention, every),
        PeriodicTask("tuneloop.actuators.reconcile", run_reconcile, settings.actuator_interval_s),
    )
