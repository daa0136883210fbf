"""Actuators: push decisions to running jobs and autoscalers, verify them, roll them back.

* :mod:`actuators.policy`: the job actuator's pure policy (bounds, maximum change per step,
  freeze window, dry-run, manual approval, verification and rollback).
* :mod:`actuators.job`: the reconcile loop that applies it to the store, idempotently.
* :mod:`actuators.tasks`: the periodic task that reconciles every job with a policy.

A component beside the tuner, not inside it: the two never import each other. A study's
trial or outcome reaches the job actuator as a desired version in the store, and what both
measure by is the core's (:mod:`tuneloop.window_stats`).

The API and the task registry use the modules in ``__all__``: ``policy_config`` (a stored
policy, checked), ``job`` and ``holds`` (a reconcile pass and its holds) and ``tasks`` (one
job's reconcile now, and the periodic pass); ``autoscaler`` has its own. A job's config
versions and their protocol are the domain's (:mod:`tuneloop.job_configs`).
"""

# Modules, not names: importing the package loads none of them.
__all__ = ["autoscaler", "holds", "job", "policy_config", "tasks"]
