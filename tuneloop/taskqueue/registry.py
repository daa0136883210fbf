"""The one list of periodic tasks, shared by Celery beat and the in-process runner."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from alerts import tasks as alert_tasks
from tuneloop.settings import Settings
from tuneloop.taskqueue import maintenance
from tuneloop.taskqueue.maintenance import task_runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FanOut:
    """Per-item work of a periodic task: ``ids()`` lists the items, ``each(id)`` handles one.

    On Celery the periodic task enqueues one ``name`` task per id (each retried on its own);
    in-process it calls ``each`` for every id in turn."""

    name: str
    """Celery name of the per-item task."""
    ids: Callable[[], Sequence[int]]
    each: Callable[[int], None]

    def run_inline(self) -> None:
        for item in self.ids():
            try:
                self.each(item)
            except Exception:
                # One bad item must not starve the others; it is tried again next tick.
                log.exception("task %s(%s) failed; it runs again at the next tick", self.name, item)


@dataclass(frozen=True, slots=True)
class PeriodicTask:
    name: str
    """Celery task name, also used in logs."""
    func: Callable[[], None]
    """Takes nothing and re-reads the store, so a late or repeated run is harmless."""
    interval_s: float
    fan_out: FanOut | None = None
    """Set when ``func`` is ``fan_out.run_inline``: Celery enqueues the items instead."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"{self.name}: interval_s must be > 0, got {self.interval_s}")

    @classmethod
    def fanning_out(cls, name: str, fan_out: FanOut, interval_s: float) -> PeriodicTask:
        return cls(name, fan_out.run_inline, interval_s, fan_out)


TUNER_DISPATCH = "tuneloop.tuner.dispatch"
TUNER_STEP = "tuneloop.tuner.step"

# The components' tasks are plain functions that take what they need from the runtime this
# process opened (task_runtime): the functions below hand it to them, so no component reaches up
# into the task queue. The tuner's tasks are imported on first use, not at registration, which
# every process does (the API's included): the tuner's numerical stack and the Kubernetes client
# would only slow its start-up.


def _running_studies() -> Sequence[int]:
    from tuner.tasks import study_ids

    return study_ids(task_runtime().sessions)


def _step_study(study_id: int) -> None:
    from tuner.tasks import step_study

    runtime = task_runtime()
    step_study(runtime.sessions, study_id, runtime.remote_series)


def _diagnose_jobs() -> None:
    from tuner.diagnosis_series import run_diagnosis

    runtime = task_runtime()
    run_diagnosis(runtime.sessions, runtime.remote_series, peak_flops=runtime.settings.peak_flops)


def _reconcile_jobs() -> None:
    from actuators.tasks import run_reconcile

    runtime = task_runtime()
    run_reconcile(runtime.sessions, runtime.remote_series)


def _autoscale() -> None:
    from actuators.autoscaler.tasks import run_autoscale

    runtime = task_runtime()
    run_autoscale(runtime.sessions, runtime.settings, runtime.remote_series)


def _evaluate_alerts() -> None:
    alert_tasks.run_evaluation(task_runtime())


def _send_notifications() -> None:
    alert_tasks.run_notifications(task_runtime())


TUNER_FAN_OUT = FanOut(TUNER_STEP, _running_studies, _step_study)
"""One pass of the tuning loop per running study (``tuner/tasks.py``)."""


def periodic_tasks(settings: Settings) -> tuple[PeriodicTask, ...]:
    every = settings.maintenance_interval_s
    # With series in a TSDB the store holds no samples: the TSDB keeps its own retention and
    # aggregates, so the store's rollups and retention have nothing to do.
    store_maintenance = (
        ()
        if settings.tsdb_url
        else (
            PeriodicTask("tuneloop.maintenance.rollups", maintenance.run_rollups, every),
            PeriodicTask("tuneloop.maintenance.compaction", maintenance.run_compaction, every),
            PeriodicTask("tuneloop.maintenance.retention", maintenance.run_retention, every),
        )
    )
    return (
        *store_maintenance,
        PeriodicTask.fanning_out(TUNER_DISPATCH, TUNER_FAN_OUT, settings.tuner_interval_s),
        PeriodicTask("tuneloop.tuner.diagnose", _diagnose_jobs, settings.tuner_interval_s),
        PeriodicTask("tuneloop.alerts.evaluate", _evaluate_alerts, settings.alerts_eval_interval_s),
        PeriodicTask(
            "tuneloop.alerts.notify", _send_notifications, settings.alerts_notify_interval_s
        ),
        PeriodicTask("tuneloop.actuators.reconcile", _reconcile_jobs, settings.actuator_interval_s),
        PeriodicTask("tuneloop.actuators.autoscale", _autoscale, settings.autoscale_interval_s),
    )
