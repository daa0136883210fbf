"""Actuators: push decisions to running jobs and autoscalers, verify them, roll them back.

* :mod:`actuators.policy`: the job actuator's pure policy (bounds, maximum change per step,
  freeze window, dry-run, manual approval, verification and rollback).
* :mod:`actuators.job`: the reconcile loop that applies it to the store, idempotently.
* :mod:`actuators.tasks`: the periodic task that reconciles every job with a policy.
"""
