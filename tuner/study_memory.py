"""The memory bound of a study, fitted on the framebuffer readings its trials stored
(``tuner.memory``; docs/tuner.md, "Memory headroom")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tuneloop.storage.models import Study, Trial
from tuner.memory import (
    MAX_PREDICTED_OOMS,
    MemoryBound,
    MemoryPoint,
    combinations,
    memory_bound,
)
from tuner.space import BATCH_SIZE, SearchSpace
from tuner.strategies.base import REASON_OOM, Observation
from tuner.study_records import study_options, study_space
from tuner.trial_measurements import TrialMeasurements


def memory_points(trials: Sequence[Trial]) -> list[MemoryPoint]:
    """The framebuffer readings the loop stored with finished trials (key
    :data:`GPU_MEMORY_KEY`), each with its trial's per-device batch size. Trials that ran out
    of memory or have no reading are left out (the OOM rule covers the former)."""
    points: list[MemoryPoint] = []
    for trial in trials:
        stored = TrialMeasurements.from_json(trial.measurements)
        reading = stored.gpu_memory
        batch = trial.params.get(BATCH_SIZE)
        if trial.state == "running" or stored.reason == REASON_OOM or reading is None:
            continue
        peak, capacity = reading.get("peak_mib"), reading.get("capacity_mib")
        if not isinstance(batch, int) or not _number(peak) or not _number(capacity):
            continue
        assert isinstance(peak, int | float) and isinstance(capacity, int | float)
        if capacity > 0 and peak >= 0 and batch >= 1:
            points.append(MemoryPoint(trial.number, batch, float(peak), float(capacity)))
    return points


def study_memory_bound(study: Study, trials: Sequence[Trial]) -> MemoryBound | None:
    """The study's memory bound from its trials (``None`` when it is switched off or the space
    has no batch size)."""
    policy = study_options(study).memory
    if not policy.enabled or BATCH_SIZE not in study_space(study):
        return None
    return memory_bound(memory_points(trials), policy.headroom)


def memory_details(
    space: SearchSpace, bound: MemoryBound | None, predicted: Sequence[Observation]
) -> dict[str, Any]:
    """The memory bound as the ask's audit entry records it: the model, the figures and the
    trials behind it, and the batch from which on proposals were excluded."""
    if bound is None:
        return {}
    details = bound.to_dict()
    details["excluded_from"] = int(predicted[0].config[BATCH_SIZE]) if predicted else None
    if bound.max_batch is not None and not predicted and combinations(space) > MAX_PREDICTED_OOMS:
        details["why"] += (
            f"; not applied: more than {MAX_PREDICTED_OOMS} combinations of the other parameters"
        )
    return {"memory_bound": details}


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
