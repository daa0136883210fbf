"""Bounds of a job's config (``bounds`` of its actuation policy): what a desired version may
hold. The one bounds check: every desired version is checked here before it is written, and
the actuation policy parses its ``bounds`` with :class:`Bound`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuneloop.errors import InvalidInput
from tuneloop.strict import refuse_unknown_keys


class PolicyError(InvalidInput):
    """An actuation policy, or a config checked against it, is invalid."""


@dataclass(frozen=True, slots=True)
class Bound:
    """Allowed values of one config key: a numeric range (either end open) or a list."""

    min: float | None = None
    max: float | None = None
    values: tuple[Any, ...] | None = None

    def problem(self, name: str, value: object) -> str | None:
        """Why ``value`` is outside this bound, or ``None`` when it is inside."""
        if self.values is not None:
            if value not in self.values:
                return f"{name}={value!r} is not one of {list(self.values)!r}"
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name}={value!r} is not a number"
        if not math.isfinite(value):
            return f"{name}={value!r} is not finite"
        if self.min is not None and value < self.min:
            return f"{name}={value!r} is below its minimum {self.min:g}"
        if self.max is not None and value > self.max:
            return f"{name}={value!r} is above its maximum {self.max:g}"
        return None

    @classmethod
    def from_dict(cls, name: str, data: object) -> Bound:
        if isinstance(data, list):
            if not data:
                raise PolicyError(f"bounds.{name}: an empty list allows nothing")
            return cls(values=tuple(data))
        if not isinstance(data, Mapping):
            raise PolicyError(f"bounds.{name}: use {{'min': x, 'max': y}} or a list of values")
        refuse_unknown_keys(data, ("min", "max"), error=PolicyError, where=f"bounds.{name}")
        low, high = data.get("min"), data.get("max")
        for end, value in (("min", low), ("max", high)):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise PolicyError(f"bounds.{name}.{end} must be a finite number, got {value!r}")
        if low is not None and high is not None and low > high:
            raise PolicyError(f"bounds.{name}: min {low} is above max {high}")
        return cls(min=low, max=high)

    def to_dict(self) -> Any:
        if self.values is not None:
            return list(self.values)
        return {k: v for k, v in (("min", self.min), ("max", self.max)) if v is not None}


def parse_bounds(data: object) -> dict[str, Bound]:
    """The ``bounds`` of a policy, config key -> bound; :class:`PolicyError` names the first
    problem."""
    bounds_data = data or {}
    if not isinstance(bounds_data, Mapping):
        raise PolicyError("bounds must be an object of config key -> bound")
    return {str(k): Bound.from_dict(str(k), v) for k, v in bounds_data.items()}


def bound_problems(bounds: Mapping[str, Bound], config: Mapping[str, Any]) -> list[str]:
    """Every key of ``config`` outside its bound, by key (keys without a bound are free)."""
    problems = []
    for name, bound in sorted(bounds.items()):
        if name in config:
            problem = bound.problem(name, config[name])
            if problem is not None:
                problems.append(problem)
    return problems
