"""tuneloop alerts component: rules over the time-series store, their evaluation into alert
states, and notifications through an outbox (docs/alerts.md).

The API and the commands use the modules in ``__all__``: ``store`` (a project's rules,
receivers, silences and alerts), ``rules`` (rule files), ``catalog`` (the metrics a rule may
name), ``health`` (receivers' delivery health), ``notifiers`` (receiver kinds) and ``tasks``
(evaluation and notification, given the process's runtime). The evaluator, the dispatcher and
the rest are this component's own: ``tasks`` builds them. ``prometheus_export`` writes a rule
pack as Prometheus rules (``python -m alerts.prometheus_export``). See docs/architecture.md.
"""

# Modules, not names: importing the package loads none of them, so registering the tasks at
# every process start stays cheap.
__all__ = ["catalog", "health", "notifiers", "rules", "store", "tasks"]
