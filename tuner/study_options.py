"""What a study stores besides its space: how the loop runs it (``Study.options``, JSON).

Pure: validation and (de)serialisation only. An invalid option raises :class:`OptionsError`
(a ``ValueError``) with one line naming it, so the API answers 422 and a task never starts a
study it could not run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final, Literal

from tuneloop.errors import InvalidInput
from tuneloop.strict import refuse_unknown_keys
from tuner.measurement import MeasurementError, MeasurementPolicy
from tuner.memory import DEFAULT_HEADROOM

Driver = Literal["tuner", "agent"]
DRIVERS: Final = ("tuner", "agent")

DEFAULT_ACK_TIMEOUT_S: Final = 300.0
"""An agent wakes on a released version within a second (its long-poll) and applies it at the
next step boundary: five minutes covers minute-long steps and a restart from a checkpoint, and
bounds how long a study waits on a job that is gone (twice this, then it ends failed)."""


_UNKNOWN_MESSAGE: Final = "unknown {noun} {unknown_joined}; known: {known}"


class OptionsError(InvalidInput):
    """An invalid study option."""


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """The GPU memory bound on the batch size (``tuner.memory``).

    - ``enabled``: fit the study's memory model from its trials' framebuffer readings and stop
      proposing batch sizes predicted not to fit; off, the readings are still recorded.
    - ``headroom``: fraction of the framebuffer a proposal must leave free, in [0, 1).
    """

    enabled: bool = True
    headroom: float = DEFAULT_HEADROOM

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise OptionsError(f"memory.enabled must be true or false, got {self.enabled!r}")
        headroom = self.headroom
        if (
            isinstance(headroom, bool)
            or not isinstance(headroom, int | float)
            or not math.isfinite(headroom)
            or not 0 <= headroom < 1
        ):
            raise OptionsError(
                f"memory.headroom must be a fraction of the framebuffer in [0, 1), got {headroom!r}"
            )
        object.__setattr__(self, "headroom", float(headroom))


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    """Guarded trials of an ``slo_throughput`` study (``tuner.trial_guard``).

    - ``enabled``: end a trial early, as ``infeasible``, once its P99 since the config was
      applied is over ``p99_factor`` x the SLO, and put the job back on the incumbent;
    - ``after_s``: seconds of the trial before the guard judges (a P99 needs requests);
    - ``hold_s``: after a guarded trial, the incumbent runs this long before the next trial,
      twice as long after each further guarded trial in a row (at most 8 x);
    - ``explore_below``: a trial starts only while the P99 of the last ``hold_s`` is at most
      this fraction of the SLO: a service with no headroom left has none to explore with.
    """

    enabled: bool = True
    p99_factor: float = 1.0
    after_s: float = 3.0
    hold_s: float = 10.0
    explore_below: float = 0.8

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise OptionsError(f"guard.enabled must be true or false, got {self.enabled!r}")
        for name in ("p99_factor", "after_s", "hold_s", "explore_below"):
            value = getattr(self, name)
            if not _positive_number(value) and not (name in ("after_s", "hold_s") and value == 0):
                raise OptionsError(f"guard.{name} must be a positive number, got {value!r}")
            object.__setattr__(self, name, float(value))


@dataclass(frozen=True, slots=True)
class StudyOptions:
    """How a study runs.

    - ``strategy_options``: keyword arguments of the strategy (``make_strategy(options=...)``).
    - ``measurement``: the window each trial is judged on (``judge_window``).
    - ``ranks``: data-parallel ranks of the job, for the effective batch and the learning rate.
    - ``slo_s``: the P99 latency bound of ``slo_throughput``.
    - ``driven_by``: ``tuner`` (the control plane's loop writes each proposal as a desired
      config and measures it) or ``agent`` (the job asks and tells through the API itself).
    - ``max_trials``: the study completes after this many finished trials and its best
      configuration is applied; ``None`` runs until stopped.
    - ``ack_timeout_s``: a trial whose desired version the job has not acknowledged in this
      long fails (the job may be gone).
    - ``warm_start_from``: ids of the earlier studies whose trials prime the strategy, fixed at
      creation so that every ask sees the same priors.
    - ``memory``: the GPU memory bound on the batch size (:class:`MemoryPolicy`).
    - ``objective_expr``: the PromQL expression of the ``promql`` objective
      (``tuner.promql_objective``, which checks it when the study is created).
    - ``throughput_floor``: ``samples_per_joule`` / ``tokens_per_joule`` only: a configuration
      whose throughput (samples/s or tokens/s, the objective's unit) is below it is infeasible.
    - ``guard``: guarded trials of ``slo_throughput`` studies (:class:`GuardPolicy`).
    """

    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    measurement: MeasurementPolicy = field(default_factory=MeasurementPolicy)
    ranks: int | None = None
    slo_s: float | None = None
    driven_by: Driver = "tuner"
    max_trials: int | None = None
    ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S
    warm_start_from: tuple[int, ...] = ()
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    objective_expr: str | None = None
    throughput_floor: float | None = None
    guard: GuardPolicy = field(default_factory=GuardPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.strategy_options, Mapping):
            raise OptionsError("strategy_options must be an object")
        if not isinstance(self.measurement, MeasurementPolicy):
            raise OptionsError("measurement must be a MeasurementPolicy")
        if not isinstance(self.memory, MemoryPolicy):
            raise OptionsError("memory must be a MemoryPolicy")
        if not isinstance(self.guard, GuardPolicy):
            raise OptionsError("guard must be a GuardPolicy")
        _check_positive_int("ranks", self.ranks)
        _check_positive_int("max_trials", self.max_trials)
        if self.slo_s is not None and not _positive_number(self.slo_s):
            raise OptionsError(f"slo_s must be a positive number of seconds, got {self.slo_s!r}")
        if self.driven_by not in DRIVERS:
            raise OptionsError(f"driven_by must be one of {', '.join(DRIVERS)}")
        if not _positive_number(self.ack_timeout_s):
            raise OptionsError(
                f"ack_timeout_s must be a positive number, got {self.ack_timeout_s!r}"
            )
        ids = tuple(self.warm_start_from)
        for study_id in ids:
            _check_positive_int("warm_start_from", study_id)
        object.__setattr__(self, "warm_start_from", ids)
        if self.objective_expr is not None and not isinstance(self.objective_expr, str):
            raise OptionsError(
                f"objective_expr must be a PromQL expression, got {self.objective_expr!r}"
            )
        if self.throughput_floor is not None:
            if not _positive_number(self.throughput_floor):
                raise OptionsError(
                    "throughput_floor must be a positive number (samples/s or tokens/s), "
                    f"got {self.throughput_floor!r}"
                )
            object.__setattr__(self, "throughput_floor", float(self.throughput_floor))
        object.__setattr__(self, "strategy_options", dict(self.strategy_options))

    def to_dict(self) -> dict[str, Any]:
        # Left out when unset, so that the options of older studies read back unchanged.
        expr = {} if self.objective_expr is None else {"objective_expr": self.objective_expr}
        floor = {} if self.throughput_floor is None else {"throughput_floor": self.throughput_floor}
        guard = {} if self.guard == GuardPolicy() else {"guard": asdict(self.guard)}
        return {
            "strategy_options": dict(self.strategy_options),
            "measurement": asdict(self.measurement),
            "ranks": self.ranks,
            "slo_s": self.slo_s,
            "driven_by": self.driven_by,
            "max_trials": self.max_trials,
            "ack_timeout_s": self.ack_timeout_s,
            "warm_start_from": list(self.warm_start_from),
            "memory": asdict(self.memory),
            **expr,
            **floor,
            **guard,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> StudyOptions:
        """The options stored with a study; keys left out take their defaults (a study created
        before options existed has ``{}``)."""
        data = dict(data or {})
        _refuse_unknown(data, cls, "study option")
        if "measurement" in data:
            data["measurement"] = measurement_policy(data["measurement"])
        if "warm_start_from" in data:
            data["warm_start_from"] = tuple(data["warm_start_from"] or ())
        if "memory" in data:
            data["memory"] = memory_policy(data["memory"])
        if "guard" in data:
            data["guard"] = guard_policy(data["guard"])
        try:
            return cls(**data)
        except TypeError as exc:
            raise OptionsError(str(exc)) from None


def measurement_policy(data: Mapping[str, Any] | MeasurementPolicy | None) -> MeasurementPolicy:
    """A :class:`MeasurementPolicy` from its JSON form (unknown keys refused)."""
    if data is None:
        return MeasurementPolicy()
    if isinstance(data, MeasurementPolicy):
        return data
    if not isinstance(data, Mapping):
        raise OptionsError("measurement must be an object")
    _refuse_unknown(data, MeasurementPolicy, "measurement option")
    try:
        return MeasurementPolicy(**data)
    except MeasurementError as exc:
        raise OptionsError(f"measurement.{exc}") from None


def memory_policy(data: Mapping[str, Any] | MemoryPolicy | None) -> MemoryPolicy:
    """A :class:`MemoryPolicy` from its JSON form (unknown keys refused)."""
    if data is None:
        return MemoryPolicy()
    if isinstance(data, MemoryPolicy):
        return data
    if not isinstance(data, Mapping):
        raise OptionsError("memory must be an object")
    _refuse_unknown(data, MemoryPolicy, "memory option")
    return MemoryPolicy(**data)


def guard_policy(data: Mapping[str, Any] | GuardPolicy | None) -> GuardPolicy:
    """A :class:`GuardPolicy` from its JSON form (unknown keys refused)."""
    if data is None:
        return GuardPolicy()
    if isinstance(data, GuardPolicy):
        return data
    if not isinstance(data, Mapping):
        raise OptionsError("guard must be an object")
    _refuse_unknown(data, GuardPolicy, "guard option")
    return GuardPolicy(**data)


def _refuse_unknown(data: Mapping[str, Any], options: type, noun: str) -> None:
    known = sorted(f.name for f in fields(options))
    refuse_unknown_keys(data, known, error=OptionsError, noun=noun, message=_UNKNOWN_MESSAGE)


def _positive_number(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )


def _check_positive_int(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionsError(f"{name} must be a positive integer, got {value!r}")
