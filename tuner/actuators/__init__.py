"""Actuators: push decisions to running jobs and autoscalers, verify them, roll them back.

* :mod:`tuner.actuators.policy`: the job actuator's pure policy (bounds, maximum change per step,
  freeze window, dry-run, manual approval, verification and rollback).
* :mod:`tuner.actuators.job`: the reconcile loop that applies it to the store, idempotently.
* :mod:`tuner.actuators.tasks`: the periodic task that reconciles every job with a policy.
"""
