"""The periodic tasks of alerting: evaluation and notification retries.

Both take the process's runtime, which the task registry opens, and re-read the store, as every
periodic task does. One :class:`Evaluator` and one :class:`Dispatcher` per process, built from
the runtime on first use and again when the runtime changes; after an evaluation that queued
notifications the dispatcher starts sending at once, so a new alert does not wait for the next
notification tick.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import TYPE_CHECKING

from tuneloop.runtime import Runtime
from tuneloop.storage.types import utcnow

if TYPE_CHECKING:
    # Imported when a task first runs: registering the tasks (every process start) stays cheap.
    from alerts.dispatch import Dispatcher
    from alerts.evaluator import Evaluator

log = logging.getLogger(__name__)

_lock = threading.Lock()
_built: tuple[Runtime, Evaluator, Dispatcher] | None = None


def components(runtime: Runtime) -> tuple[Evaluator, Dispatcher]:
    """The evaluator and dispatcher of ``runtime``, rebuilt when the runtime changes (new
    settings, or a forked worker process that opened its own)."""
    from alerts.dispatch import Dispatcher
    from alerts.evaluation_metrics import EVALUATION
    from alerts.evaluator import Evaluator

    global _built
    with _lock:
        if _built is None or _built[0] is not runtime:
            if _built is not None:
                _built[2].close()
            url = runtime.settings.alerts_external_url or (
                f"http://{runtime.settings.host}:{runtime.settings.port}"
            )
            dispatcher = Dispatcher(
                runtime.sessions,
                external_url=url,
                allowed_networks=runtime.settings.alerts_allowed_target_networks,
                eval_interval_s=runtime.settings.alerts_eval_interval_s,
            )
            slack = timedelta(seconds=runtime.settings.alerts_eval_interval_s / 2)
            evaluator = Evaluator(
                runtime.engine,
                runtime.sessions,
                on_queued=dispatcher.dispatch,
                for_slack=slack,
                series=runtime.remote_series,
                metrics=EVALUATION,
            )
            _built = (runtime, evaluator, dispatcher)
        return _built[1], _built[2]


def close_components() -> None:
    global _built
    with _lock:
        if _built is not None:
            _built[2].close()
        _built = None


def run_evaluation(runtime: Runtime) -> None:
    evaluator, _ = components(runtime)
    result = evaluator.evaluate()
    if result.failed_rules:
        log.warning("alert rules that failed this pass: %s", ", ".join(result.failed_rules))
    log.debug("alert evaluation: %s", result)


HISTORY = timedelta(days=30)
"""How long resolved alerts and settled notifications are kept."""


def run_notifications(runtime: Runtime) -> None:
    """Send what is due (retries, and anything a pass queued while the pool was full), and
    forget history older than :data:`HISTORY`."""
    from alerts.evaluator import prune_history

    _, dispatcher = components(runtime)
    dispatcher.dispatch()
    prune_history(runtime.sessions, utcnow(), HISTORY)
