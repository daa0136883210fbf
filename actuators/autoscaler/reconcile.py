"""One autoscaler pass: read the target's replicas, decide, scale only when they differ."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol

from actuators.autoscaler.policy import (
    Metrics,
    ScaleDecision,
    ScalePolicy,
    ScaleState,
    decide_scale,
)

log = logging.getLogger(__name__)


class ScaleTarget(Protocol):
    def get_replicas(self) -> int: ...

    def set_replicas(self, replicas: int, reason: str) -> None: ...


def autoscale(
    target: ScaleTarget,
    policy: ScalePolicy,
    state: ScaleState,
    metrics: Metrics | None,
    now: float,
    *,
    dry_run: bool = False,
) -> ScaleDecision:
    """Reconcile ``target`` once. The target's own replica count wins over the remembered one
    (someone may have scaled it by hand). Returns the decision; remember its ``state``."""
    observed = target.get_replicas()
    decision = decide_scale(policy, replace(state, replicas=observed), metrics, now)
    if decision.replicas != observed:
        if dry_run:
            log.info(
                "%s: dry run, would scale %d -> %d (%s)",
                target,
                observed,
                decision.replicas,
                decision.reason,
            )
            return replace(decision, state=replace(state, replicas=observed))
        target.set_replicas(decision.replicas, decision.reason)
        log.info("%s: scaled %d -> %d (%s)", target, observed, decision.replicas, decision.reason)
    return decision
