"""The job actuator's policy as a person writes it (``PUT .../actuator``): bounds, maximum
change per step, freeze window, dry run, approval and verification, parsed and validated.
:class:`PolicyError` names the first problem by its field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tuneloop.config_bounds import Bound, PolicyError, bound_problems, parse_bounds
from tuneloop.strict import refuse_unknown_keys

Direction = Literal["maximize", "minimize"]
LISTED = "unknown {noun} field(s) {{unknown}}; known: {{known}}"
"""The wording of an unknown policy field, which API clients match."""

# Bounds are the domain's (every desired version is checked against them there); the policy
# holds them, so it exports their types too.
__all__ = ["LISTED", "ActuationPolicy", "Bound", "Direction", "PolicyError", "VerifyPolicy"]


@dataclass(frozen=True, slots=True)
class VerifyPolicy:
    """How a change is verified: the objective is the mean of ``metric`` (rank 0 of the job)
    over ``window_s`` before the change and over ``window_s`` after ``settle_s`` past it."""

    enabled: bool = True
    metric: str = "tuneloop_samples_per_second"
    direction: Direction = "maximize"
    settle_s: float = 5.0
    window_s: float = 30.0
    noise_sigmas: float = 2.0
    """Worse by more than this many standard errors of the difference means worse."""
    min_samples: int = 4

    def due_at(self, changed_at: float) -> float:
        return changed_at + self.settle_s + self.window_s


@dataclass(frozen=True, slots=True)
class ActuationPolicy:
    bounds: Mapping[str, Bound] = field(default_factory=dict)
    max_change: Mapping[str, float] = field(default_factory=dict)
    """Largest factor (> 1) by which a positive numeric key may grow or shrink in one step."""
    freeze_s: float = 0.0
    """No new change for this long after the last release (verification also holds changes).
    A job's registration is no change: its first change is released at once."""
    freeze_study_trials: bool = False
    """Whether the freeze also spaces a tuning study's trials (by default the study times
    them; its outcome is never held)."""
    dry_run: bool = False
    """Decide and record, but release nothing."""
    require_approval: bool = False
    """Release a goal only once a person approved its version (or a later one)."""
    verify: VerifyPolicy = field(default_factory=VerifyPolicy)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ActuationPolicy:
        """Parse and validate a stored or submitted policy; :class:`PolicyError` names the
        first problem."""
        data = dict(data or {})
        known = set(cls.__dataclass_fields__)
        refuse_unknown_keys(data, known, error=PolicyError, message=LISTED.format(noun="policy"))
        bounds = parse_bounds(data.get("bounds"))
        changes_data = data.get("max_change") or {}
        if not isinstance(changes_data, Mapping):
            raise PolicyError("max_change must be an object of config key -> factor")
        max_change: dict[str, float] = {}
        for key, factor in changes_data.items():
            if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 1:
                raise PolicyError(f"max_change.{key} must be a factor > 1, got {factor!r}")
            max_change[str(key)] = float(factor)
        freeze = _number(data.get("freeze_s", 0.0), "freeze_s")
        verify = _verify_from_dict(data.get("verify") or {})
        for flag in ("freeze_study_trials", "dry_run", "require_approval"):
            if not isinstance(data.get(flag, False), bool):
                raise PolicyError(f"{flag} must be true or false")
        return cls(
            bounds=bounds,
            max_change=max_change,
            freeze_s=freeze,
            freeze_study_trials=bool(data.get("freeze_study_trials", False)),
            dry_run=bool(data.get("dry_run", False)),
            require_approval=bool(data.get("require_approval", False)),
            verify=verify,
        )

    def to_dict(self) -> dict[str, Any]:
        verify = self.verify
        return {
            "bounds": {k: b.to_dict() for k, b in self.bounds.items()},
            "max_change": dict(self.max_change),
            "freeze_s": self.freeze_s,
            "freeze_study_trials": self.freeze_study_trials,
            "dry_run": self.dry_run,
            "require_approval": self.require_approval,
            "verify": {
                "enabled": verify.enabled,
                "metric": verify.metric,
                "direction": verify.direction,
                "settle_s": verify.settle_s,
                "window_s": verify.window_s,
                "noise_sigmas": verify.noise_sigmas,
                "min_samples": verify.min_samples,
            },
        }

    def bound_problems(self, config: Mapping[str, Any]) -> list[str]:
        """Every key of ``config`` outside its bound, by key (keys without a bound are free)."""
        return bound_problems(self.bounds, config)


def _number(value: object, name: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PolicyError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise PolicyError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _verify_from_dict(data: object) -> VerifyPolicy:
    if not isinstance(data, Mapping):
        raise PolicyError("verify must be an object")
    default = VerifyPolicy()
    known = set(VerifyPolicy.__dataclass_fields__)
    refuse_unknown_keys(data, known, error=PolicyError, message=LISTED.format(noun="verify"))
    direction = data.get("direction", default.direction)
    if direction not in ("maximize", "minimize"):
        raise PolicyError(f"verify.direction must be maximize or minimize, got {direction!r}")
    metric = data.get("metric", default.metric)
    if not isinstance(metric, str) or not metric:
        raise PolicyError("verify.metric must be a metric name")
    enabled = data.get("enabled", default.enabled)
    if not isinstance(enabled, bool):
        raise PolicyError("verify.enabled must be true or false")
    min_samples = data.get("min_samples", default.min_samples)
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
        raise PolicyError(f"verify.min_samples must be an integer >= 2, got {min_samples!r}")
    return VerifyPolicy(
        enabled=enabled,
        metric=metric,
        direction=direction,
        settle_s=_number(data.get("settle_s", default.settle_s), "verify.settle_s"),
        window_s=_number(data.get("window_s", default.window_s), "verify.window_s", positive=True),
        noise_sigmas=_number(data.get("noise_sigmas", default.noise_sigmas), "verify.noise_sigmas"),
        min_samples=min_samples,
    )
