"""Metrics of rule evaluation, as Prometheus has for its rule groups: a project's rules are
evaluated together in one transaction each pass, so a project is tuneloop's rule group.

``tuneloop_alert_rule_group_duration_seconds`` (histogram), ``..._evaluations_total``,
``..._last_evaluation_timestamp_seconds`` and ``..._rules`` per project, and
``tuneloop_alert_rule_evaluation_failures_total`` per project and rule. They are the evaluating
process's own (``tuneloop up`` serves them on ``/metrics``; a separate Celery worker keeps
them to itself). Shown as the receivers' health is (:class:`alerts.health.Audience`): by name
only to a token of the project, or an admin's; without a token the process's totals.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from alerts.health import EVERY_PROJECT, Audience

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EvaluationMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._project_ids: dict[str, int] = {}
        self.passes = 0
        self.failures = 0
        self.duration = Histogram(
            "tuneloop_alert_rule_group_duration_seconds",
            "Time to evaluate a project's alert rules and queue their notifications.",
            ["project"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.evaluations = Counter(
            "tuneloop_alert_rule_group_evaluations",
            "Evaluations of a project's alert rules.",
            ["project"],
            registry=self.registry,
        )
        self.last_run = Gauge(
            "tuneloop_alert_rule_group_last_evaluation_timestamp_seconds",
            "When a project's alert rules were last evaluated (Unix seconds).",
            ["project"],
            registry=self.registry,
        )
        self.rules = Gauge(
            "tuneloop_alert_rule_group_rules",
            "Enabled alert rules of a project at its last evaluation.",
            ["project"],
            registry=self.registry,
        )
        self.rule_failures = Counter(
            "tuneloop_alert_rule_evaluation_failures",
            "Evaluations of an alert rule that failed (its query or its templates).",
            ["project", "rule"],
            registry=self.registry,
        )

    def observe(
        self,
        project_id: int,
        project: str,
        *,
        seconds: float,
        finished_at: float,
        rules: int,
        failed: list[str],
    ) -> None:
        with self._lock:
            self._project_ids[project] = project_id
            self.passes += 1
            self.failures += len(failed)
        self.duration.labels(project).observe(seconds)
        self.evaluations.labels(project).inc()
        self.last_run.labels(project).set(finished_at)
        self.rules.labels(project).set(rules)
        for rule in failed:
            self.rule_failures.labels(project, rule).inc()

    def visible_to(self, audience: Audience) -> set[str]:
        with self._lock:
            return {name for name, pid in self._project_ids.items() if audience.sees(pid)}


class EvaluationCollector(Collector):
    """The process's totals for anyone; each project's series for those who see it."""

    def __init__(self, metrics: EvaluationMetrics, audience: Audience = EVERY_PROJECT) -> None:
        self.metrics = metrics
        self.audience = audience

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "tuneloop_alert_evaluations",
            "Evaluations of a project's alert rules, every project's together.",
            value=self.metrics.passes,
        )
        yield CounterMetricFamily(
            "tuneloop_alert_evaluation_failures",
            "Failed alert rule evaluations, every project's together.",
            value=self.metrics.failures,
        )
        shown = self.metrics.visible_to(self.audience)
        if not shown:
            return
        for family in self.metrics.registry.collect():
            samples = [s for s in family.samples if s.labels.get("project") in shown]
            if samples:
                family.samples = samples
                yield family


EVALUATION = EvaluationMetrics()
"""The process's: the evaluator of ``alerts.tasks`` records here, ``/metrics`` reads it."""
