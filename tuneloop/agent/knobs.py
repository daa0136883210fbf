"""A job's own knobs: settings the job declares when its agent registers (name, type, range or
choices, default) so that a study may search them, and the callback that applies a new value
at a step boundary.

::

    workers = Knob.integer("loader_workers", 0, 8, default=2, apply=set_workers, reload=True)
    compress = Knob.choice("grad_compression", (False, True), default=False, apply=set_compress)
    training = TunedTraining(..., knobs=[workers, compress])

The control plane validates every declaration (``tuner.knobs``) and refuses a bad one with a
422 naming it; the agent checks a released value against its knob before anything is applied,
so a value the job cannot run is refused on every rank at the same step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

LOADER_WORKERS: Final = "loader_workers"
PREFETCH_FACTOR: Final = "prefetch_factor"
BUCKET_MB: Final = "bucket_mb"
GRAD_COMPRESSION: Final = "grad_compression"
"""The names :mod:`tuneloop.agent.torch`'s appliers declare, which a study from a diagnosis
looks for (the server's ``tuner.knobs`` spells them too)."""
BUILT_IN: Final = ("batch_size", "sync_period", "learning_rate", "power_limit_w")
"""What :class:`~tuneloop.agent.torch.TunedTraining` and the agent (the power limit,
:mod:`tuneloop.agent.power`) apply themselves: not knobs."""

Value = int | float | str | bool


class KnobError(ValueError):
    """A bad knob declaration, or a value outside a knob's range: the message names it."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def _has_power_of_two(low: int, high: int) -> bool:
    # The smallest power of two >= low (low >= 1 here).
    return 1 << (low - 1).bit_length() <= high


@dataclass(frozen=True)
class Knob:
    """One declared knob. ``apply(value)`` runs on every rank at the step boundary a new value
    arrives at, before the step; with ``reload`` the training loop's data loader is rebuilt
    after it (a new value for the loader's construction)."""

    name: str
    default: Value
    apply: Callable[[Any], None]
    low: int | None = None
    high: int | None = None
    choices: tuple[Value, ...] | None = None
    log: bool = False
    powers_of_two: bool = False
    reload: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise KnobError(f"a knob needs a name, got {self.name!r}")
        if self.name in BUILT_IN:
            raise KnobError(f"knob {self.name!r}: the training loop applies it itself")
        if self.choices is None:
            if not (_is_int(self.low) and _is_int(self.high)):
                raise KnobError(f"knob {self.name!r}: give integer low and high, or choices")
            assert self.low is not None and self.high is not None
            if self.low > self.high:
                raise KnobError(f"knob {self.name!r}: low {self.low} > high {self.high}")
            if (self.log or self.powers_of_two) and self.low < 1:
                raise KnobError(f"knob {self.name!r}: a log scale needs low >= 1, got {self.low}")
            if self.powers_of_two and not _has_power_of_two(self.low, self.high):
                raise KnobError(
                    f"knob {self.name!r}: [{self.low}, {self.high}] holds no power of two"
                )
        elif not self.choices:
            raise KnobError(f"knob {self.name!r}: empty choices")
        self.check(self.default)

    @classmethod
    def integer(
        cls,
        name: str,
        low: int,
        high: int,
        *,
        default: int,
        apply: Callable[[Any], None],
        log: bool = False,
        powers_of_two: bool = False,
        reload: bool = False,
    ) -> Knob:
        """An integer in ``[low, high]``; ``log``: searched on a log scale; ``powers_of_two``:
        only the powers of two in it (a log scale too). Both need ``low >= 1``."""
        return cls(
            name,
            default,
            apply,
            low=low,
            high=high,
            log=log,
            powers_of_two=powers_of_two,
            reload=reload,
        )

    @classmethod
    def choice(
        cls,
        name: str,
        choices: Sequence[Value],
        *,
        default: Value,
        apply: Callable[[Any], None],
        reload: bool = False,
    ) -> Knob:
        return cls(name, default, apply, choices=tuple(choices), reload=reload)

    def check(self, value: object) -> Value:
        """``value`` if the knob can take it, else a :class:`KnobError` naming the knob."""
        if self.choices is not None:
            if any(type(c) is type(value) and c == value for c in self.choices):
                return value  # type: ignore[return-value]
            raise KnobError(f"{self.name}={value!r} is not one of {list(self.choices)!r}")
        assert self.low is not None and self.high is not None
        if not _is_int(value) or not self.low <= value <= self.high:  # type: ignore[operator]
            raise KnobError(f"{self.name}={value!r} is outside [{self.low}, {self.high}]")
        if self.powers_of_two and not _is_power_of_two(value):  # type: ignore[arg-type]
            raise KnobError(f"{self.name}={value!r} is not a power of two")
        return value  # type: ignore[return-value]

    def declaration(self) -> dict[str, Any]:
        """The wire form the control plane stores (``tuner.knobs``)."""
        if self.choices is not None:
            return {
                "name": self.name,
                "type": "categorical",
                "choices": list(self.choices),
                "default": self.default,
            }
        return {
            "name": self.name,
            "type": "int",
            "low": self.low,
            "high": self.high,
            "log": self.log,
            "powers_of_two": self.powers_of_two,
            "default": self.default,
        }


def check_unique(knobs: Sequence[Knob]) -> dict[str, Knob]:
    by_name: dict[str, Knob] = {}
    for knob in knobs:
        if knob.name in by_name:
            raise KnobError(f"knob {knob.name!r} is declared twice")
        by_name[knob.name] = knob
    return by_name
