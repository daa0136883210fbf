"""The parameters a search space is made of: integers (linear, log scale or powers of two) and
categorical choices, each with its own lattice, scale and JSON form; a bad parameter is refused
at construction with one :class:`SpaceError` naming it and the problem."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeGuard

import numpy as np

from tuneloop.errors import InvalidInput

ParamValue: TypeAlias = int | float | str | bool
Config: TypeAlias = Mapping[str, ParamValue]


class SpaceError(InvalidInput):
    """A search space or a configuration is invalid; the message names what and why."""


def is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    # bool is an int subclass; a True batch size is a bug, not a 1.
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise SpaceError(f"parameter name must be a non-empty string, got {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class IntParam:
    """An integer in ``[low, high]``.

    ``log``: searched and spaced on a log scale (needs ``low >= 1``).
    ``powers_of_two``: only the powers of two inside the bounds are valid (implies log scale).
    """

    name: str
    low: int
    high: int
    log: bool = False
    powers_of_two: bool = False

    def __post_init__(self) -> None:
        check_name(self.name)
        for bound in ("low", "high"):
            value = getattr(self, bound)
            if not is_int(value):
                raise SpaceError(f"{self.name}: {bound} must be an integer, got {value!r}")
            object.__setattr__(self, bound, int(value))  # numpy ints become plain ints
        if self.low > self.high:
            raise SpaceError(f"{self.name}: inverted bounds, low {self.low} > high {self.high}")
        if (self.log or self.powers_of_two) and self.low < 1:
            scale = "powers of two" if self.powers_of_two else "log scale"
            raise SpaceError(f"{self.name}: {scale} needs low >= 1, got {self.low}")
        if self.powers_of_two and not self._powers():
            raise SpaceError(
                f"{self.name}: bounds [{self.low}, {self.high}] contain no power of two"
            )

    @property
    def log_scale(self) -> bool:
        return self.log or self.powers_of_two

    def _powers(self) -> tuple[int, ...]:
        first = max(0, math.ceil(math.log2(self.low))) if self.low >= 1 else 0
        powers = []
        exponent = first
        while 2**exponent <= self.high:
            if 2**exponent >= self.low:
                powers.append(2**exponent)
            exponent += 1
        return tuple(powers)

    def values(self, resolution: int | None = None) -> tuple[int, ...]:
        """The lattice of this parameter, ascending.

        Powers of two: all of them. Otherwise every integer when the range has at most
        ``resolution`` of them (``None``: always every integer), else ``resolution`` points evenly
        spaced in the parameter's scale, rounded, always including both bounds.
        """
        if self.powers_of_two:
            return self._powers()
        count = self.high - self.low + 1
        if resolution is None or count <= resolution:
            return tuple(range(self.low, self.high + 1))
        if resolution < 2:
            raise SpaceError(f"resolution must be >= 2, got {resolution}")
        if self.log:
            points = np.geomspace(self.low, self.high, resolution)
        else:
            points = np.linspace(self.low, self.high, resolution)
        return tuple(sorted({round(float(p)) for p in points}))

    def contains(self, value: object) -> bool:
        if not is_int(value):
            return False
        number = int(value)
        if not self.low <= number <= self.high:
            return False
        return not self.powers_of_two or (number & (number - 1)) == 0

    def unit(self, value: int) -> float:
        """Position of ``value`` in [0, 1] on the parameter's scale (log for log/powers)."""
        return float(self.units(np.asarray([value]))[0])

    def units(self, values: np.ndarray) -> np.ndarray:
        """:meth:`unit` of many values at once."""
        # Powers of two are measured between the extreme powers, not the bounds, so that the
        # lattice (the powers) spans exactly [0, 1].
        powers = self._powers() if self.powers_of_two else ()
        low, high = (powers[0], powers[-1]) if powers else (self.low, self.high)
        data = np.asarray(values, dtype=float)
        if low == high:
            return np.zeros_like(data)
        if self.log_scale:
            return np.asarray((np.log(data) - math.log(low)) / (math.log(high) - math.log(low)))
        return np.asarray((data - low) / (high - low))

    def from_unit(self, u: float) -> int:
        """The lattice value at position ``u`` in [0, 1] of the parameter's scale (inverse of
        :meth:`unit`, rounded to the nearest valid value on that scale)."""
        u = min(max(float(u), 0.0), 1.0)
        if self.powers_of_two:
            powers = self._powers()
            return powers[min(int(u * len(powers)), len(powers) - 1)]
        if self.log:
            # Equal shares of [0, 1] per integer in log space: floor of exp over [low, high + 1).
            value = math.floor(
                math.exp(math.log(self.low) + u * math.log((self.high + 1) / self.low))
            )
        else:
            value = math.floor(self.low + u * (self.high - self.low + 1))
        return min(max(value, self.low), self.high)

    def sample(self, rng: np.random.Generator) -> int:
        """Uniform on the parameter's scale: the discrete log-uniform for log (each integer
        gets a share proportional to ``log((v + 1) / v)``), a uniform exponent for powers of
        two, uniform otherwise."""
        return self.from_unit(rng.random())

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "int",
            "name": self.name,
            "low": self.low,
            "high": self.high,
            "log": self.log,
            "powers_of_two": self.powers_of_two,
        }


@dataclass(frozen=True, slots=True)
class CategoricalParam:
    """One of a fixed set of JSON scalars (strings, numbers, booleans)."""

    name: str
    choices: tuple[ParamValue, ...]

    def __post_init__(self) -> None:
        check_name(self.name)
        if isinstance(self.choices, str | bytes) or not isinstance(self.choices, Iterable):
            raise SpaceError(f"{self.name}: choices must be a list, got {self.choices!r}")
        choices = tuple(self.choices)
        if not choices:
            raise SpaceError(f"{self.name}: empty choices")
        for choice in choices:
            if not isinstance(choice, str | int | float | bool) or (
                isinstance(choice, float) and not math.isfinite(choice)
            ):
                raise SpaceError(f"{self.name}: choice {choice!r} is not a JSON scalar")
        # Keyed by (type, value) so that 1, 1.0 and True stay distinct choices.
        keys = [(type(c).__name__, c) for c in choices]
        if len(set(keys)) != len(keys):
            raise SpaceError(f"{self.name}: duplicate choices in {list(choices)!r}")
        object.__setattr__(self, "choices", choices)

    def values(self, resolution: int | None = None) -> tuple[ParamValue, ...]:
        return self.choices

    def index(self, value: object) -> int:
        for i, choice in enumerate(self.choices):
            if type(choice) is type(value) and choice == value:
                return i
        return -1

    def contains(self, value: object) -> bool:
        return self.index(value) >= 0

    def sample(self, rng: np.random.Generator) -> ParamValue:
        return self.choices[int(rng.integers(len(self.choices)))]

    def from_unit(self, u: float) -> ParamValue:
        u = min(max(float(u), 0.0), 1.0)
        return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "categorical", "name": self.name, "choices": list(self.choices)}


Param: TypeAlias = IntParam | CategoricalParam


def param_from_dict(data: Mapping[str, Any]) -> Param:
    if not isinstance(data, Mapping):
        raise SpaceError(f"a parameter must be an object, got {data!r}")
    kind = data.get("type")
    try:
        if kind == "int":
            return IntParam(
                name=data["name"],
                low=data["low"],
                high=data["high"],
                log=bool(data.get("log", False)),
                powers_of_two=bool(data.get("powers_of_two", False)),
            )
        if kind == "categorical":
            return CategoricalParam(name=data["name"], choices=tuple(data["choices"]))
    except KeyError as exc:
        raise SpaceError(f"parameter {data.get('name')!r}: missing field {exc.args[0]!r}") from None
    raise SpaceError(f"parameter {data.get('name')!r}: unknown type {kind!r} (int, categorical)")


def describe_param(param: Param) -> str:
    if isinstance(param, CategoricalParam):
        return f"choices {list(param.choices)!r}"
    kind = " (powers of two)" if param.powers_of_two else ""
    return f"[{param.low}, {param.high}]{kind}"
