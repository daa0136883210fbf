"""GPU memory headroom as a bound on the per-device batch: model, bound, and how it reaches a
strategy. Pure: the loop reads the figures from the store (``readings.gpu_memory``), this module
only computes.

The model is the simplest one that explains a training job's framebuffer use: weights, optimizer
state, gradient buffers and the allocator's pools are fixed, activations grow linearly with the
per-device batch, so ``peak_mib = fixed_mib + per_sample_mib * batch``. It is fitted by least
squares over the trials that have a measurement, and needs at least two distinct batch sizes
(one batch says nothing about the slope). The largest batch it predicts to leave ``headroom``
(a fraction of the framebuffer) free is the bound.

The bound reaches a strategy the way an out-of-memory report does: as an ``infeasible``
observation with reason ``oom`` at the smallest batch above the bound (``oom_rule`` then
excludes it and every larger batch). The strategy keeps its space and its history, so nothing it
learnt is lost when the bound moves with new measurements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any, Final

from tuneloop.errors import InvalidInput
from tuner.space import (
    BATCH_SIZE,
    BUCKET_MB,
    SYNC_PERIOD,
    IntParam,
    Param,
    ParamValue,
    SearchSpace,
)
from tuner.strategies.base import REASON_OOM, Observation

DEFAULT_HEADROOM: Final = 0.1
"""Fraction of the framebuffer the bound leaves free by default."""
MAX_PREDICTED_OOMS: Final = 1_000
"""At most this many predicted-OOM observations (one per combination of the parameters the OOM
rule holds fixed); past it the bound is not applied rather than flooding the history."""


class MemoryModelError(InvalidInput):
    """Invalid input to the memory model."""


@dataclass(frozen=True, slots=True)
class MemoryPoint:
    """One trial's measurement: its per-device ``batch``, the peak framebuffer use (MiB) of the
    job's most loaded GPU during its window, and the smallest framebuffer (used + free, MiB)
    among those GPUs."""

    trial: int
    batch: int
    peak_mib: float
    capacity_mib: float

    def __post_init__(self) -> None:
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise MemoryModelError(f"trial {self.trial}: batch must be a positive integer")
        for name in ("peak_mib", "capacity_mib"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise MemoryModelError(f"trial {self.trial}: {name} must be a finite number >= 0")
        if self.capacity_mib <= 0:
            raise MemoryModelError(f"trial {self.trial}: capacity_mib must be > 0")


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """``peak_mib = fixed_mib + per_sample_mib * batch``; ``max_residual_mib``: the worst
    misfit among the points (how far to trust it)."""

    fixed_mib: float
    per_sample_mib: float
    max_residual_mib: float
    points: int
    batches: tuple[int, ...]

    def predict(self, batch: float) -> float:
        return self.fixed_mib + self.per_sample_mib * batch


def fit_memory_model(points: Sequence[MemoryPoint]) -> MemoryModel | None:
    """Least-squares line through ``(batch, peak_mib)``; ``None`` with fewer than two distinct
    batch sizes."""
    batches = sorted({p.batch for p in points})
    if len(batches) < 2:
        return None
    n = len(points)
    mean_x = sum(p.batch for p in points) / n
    mean_y = sum(p.peak_mib for p in points) / n
    sxx = sum((p.batch - mean_x) ** 2 for p in points)
    sxy = sum((p.batch - mean_x) * (p.peak_mib - mean_y) for p in points)
    slope = sxy / sxx  # sxx > 0: two distinct batches
    fixed = mean_y - slope * mean_x
    residual = max(abs(p.peak_mib - (fixed + slope * p.batch)) for p in points)
    return MemoryModel(fixed, slope, residual, n, tuple(batches))


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """The outcome of :func:`memory_bound`, with every figure behind it (what the audit log
    records). ``max_batch`` is ``None`` when no bound applies (``why`` says why)."""

    headroom: float
    max_batch: int | None
    why: str
    model: MemoryModel | None = None
    capacity_mib: float | None = None
    limit_mib: float | None = None
    used: tuple[MemoryPoint, ...] = ()

    @property
    def applies(self) -> bool:
        return self.max_batch is not None

    def to_dict(self) -> dict[str, Any]:
        model = self.model
        return {
            "applies": self.applies,
            "why": self.why,
            "headroom": self.headroom,
            "max_batch": self.max_batch,
            "capacity_mib": _round(self.capacity_mib),
            "limit_mib": _round(self.limit_mib),
            "model": None
            if model is None
            else {
                "fixed_mib": _round(model.fixed_mib),
                "per_sample_mib": _round(model.per_sample_mib),
                "max_residual_mib": _round(model.max_residual_mib),
                "batches": list(model.batches),
            },
            "points": [
                {"trial": p.trial, "batch": p.batch, "peak_mib": p.peak_mib} for p in self.used
            ],
        }


def memory_bound(points: Sequence[MemoryPoint], headroom: float = DEFAULT_HEADROOM) -> MemoryBound:
    """The largest per-device batch whose predicted peak leaves ``headroom`` of the smallest
    framebuffer free: ``floor((capacity * (1 - headroom) - fixed) / per_sample)``.

    No bound (``max_batch`` ``None``) with fewer than two distinct batches, or when memory does
    not grow with the batch (a slope <= 0: the allocator's pools hide the activations, and
    nothing can be extrapolated). ``max_batch`` may be 0: not even one sample is predicted to
    fit."""
    if not isinstance(headroom, int | float) or not 0 <= headroom < 1:
        raise MemoryModelError(f"headroom must be in [0, 1), got {headroom!r}")
    used = tuple(points)
    model = fit_memory_model(used)
    if model is None:
        batches = sorted({p.batch for p in used})
        return MemoryBound(
            headroom,
            None,
            f"needs measurements at 2 distinct batch sizes, has {len(batches)} ({batches})",
            used=used,
        )
    capacity = min(p.capacity_mib for p in used)
    limit = capacity * (1 - headroom)
    if model.per_sample_mib <= 0:
        return MemoryBound(
            headroom,
            None,
            f"memory does not grow with the batch ({model.per_sample_mib:.3g} MiB per sample)",
            model,
            capacity,
            limit,
            used,
        )
    max_batch = max(0, math.floor((limit - model.fixed_mib) / model.per_sample_mib))
    why = (
        f"{model.fixed_mib:.0f} MiB + {model.per_sample_mib:.3g} MiB x batch stays under "
        f"{limit:.0f} MiB ({1 - headroom:.0%} of {capacity:.0f} MiB) up to batch {max_batch}"
    )
    return MemoryBound(headroom, max_batch, why, model, capacity, limit, used)


def first_excluded_batch(param: IntParam, max_batch: int) -> int | None:
    """The smallest valid batch of ``param`` above ``max_batch``, from which on the bound
    excludes; ``None`` when every batch of the space fits. The smallest batch of the space is
    never excluded (a bound below it is a model that overshoots at the low end, and a study with
    nothing left to propose helps no one): the bound then leaves that one batch."""
    valid = param.values(None) if param.powers_of_two else None
    smallest = valid[0] if valid else param.low
    cutoff = max(max_batch, smallest)
    if valid is not None:
        above = [v for v in valid if v > cutoff]
        return above[0] if above else None
    return cutoff + 1 if cutoff + 1 <= param.high else None


def predicted_oom_observations(
    space: SearchSpace, max_batch: int, *, first_number: int
) -> tuple[Observation, ...]:
    """Observations that tell a strategy "batch ``> max_batch`` runs out of memory": one
    ``infeasible``/``oom`` observation at :func:`first_excluded_batch` per combination of the
    parameters the OOM rule holds fixed (those other than batch, sync period and bucket size),
    marked ``prior`` (not a trial of this study) and numbered downwards from ``first_number``.
    Empty when nothing is excluded or the combinations exceed :data:`MAX_PREDICTED_OOMS`."""
    if BATCH_SIZE not in space:
        return ()
    param = space[BATCH_SIZE]
    if not isinstance(param, IntParam):
        return ()
    excluded = first_excluded_batch(param, max_batch)
    if excluded is None:
        return ()
    free = (SYNC_PERIOD, BUCKET_MB)
    held = [p for p in space.params if p.name != BATCH_SIZE and p.name not in free]
    if combinations(space) > MAX_PREDICTED_OOMS:
        return ()
    # Parameters the rule ignores take their first value: any value would do.
    base: dict[str, ParamValue] = {
        p.name: p.values(None)[0] for p in space.params if p.name in free
    }
    result = []
    for i, values in enumerate(product(*(p.values(None) for p in held))):
        config: Mapping[str, ParamValue] = {
            BATCH_SIZE: excluded,
            **base,
            **{p.name: v for p, v in zip(held, values, strict=True)},
        }
        result.append(
            Observation(
                number=first_number - i,
                config=space.validate(config),
                state="infeasible",
                reason=REASON_OOM,
                prior=True,
            )
        )
    return tuple(result)


def combinations(space: SearchSpace) -> int:
    """How many predicted-OOM observations the bound needs in ``space``: the number of value
    combinations of the parameters the OOM rule holds fixed."""
    free = (BATCH_SIZE, SYNC_PERIOD, BUCKET_MB)
    return math.prod(_size(p) for p in space.params if p.name not in free)


def _size(param: Param) -> int:
    if isinstance(param, IntParam) and not param.powers_of_two:
        return param.high - param.low + 1  # without building every value
    return len(param.values(None))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
