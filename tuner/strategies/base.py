"""The one ask interface every strategy implements, and the frozen trial records it reads.

Strategies follow Optuna's samplers: they keep almost no state. Each ``ask`` receives the whole
history of the study as frozen :class:`Observation` objects and returns the next configuration;
there is no ``tell``. A restarted worker, a resumed study or a study whose trials were edited in
the store therefore loses nothing and proposes exactly what it would have proposed before
(proposals depend only on the seed and the history). A strategy may cache derived work keyed by
the history (the Bayesian model is refitted only when the data changes), never anything that
changes its answer.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import ClassVar, Literal, Protocol, TypeAlias, runtime_checkable

import numpy as np
from threadpoolctl import threadpool_limits

from tuneloop.errors import Conflict
from tuner.objectives import Direction, check_direction
from tuner.space import BATCH_SIZE, BUCKET_MB, SYNC_PERIOD, ParamValue, SearchSpace

TrialState: TypeAlias = Literal["running", "complete", "infeasible", "failed"]
TRIAL_STATES: tuple[TrialState, ...] = ("running", "complete", "infeasible", "failed")

REASON_OOM = "oom"
"""``reason`` of an infeasible observation whose configuration ran out of device memory."""
REASON_SLO = "slo"
"""Starts the ``reason`` of an infeasible observation whose configuration broke the latency SLO
(``slo_throughput``'s verdict, or a guarded trial's: ``tuner.trial_guard``)."""
REASON_OVERLOAD = "slo: overload"
"""Starts the reason of an SLO breach the batcher's wait cannot explain: the queue did, the
configuration could not carry the load (``tuner.slo_breach``)."""
REASON_WAIT = "slo: wait"
"""Starts the reason of an SLO breach by a configuration whose batching wait is a large share
of the SLO: waiting longer could only make it worse (``tuner.slo_breach``)."""
CAPACITY_KNOBS = ("max_batch_size", "max_delay_ms")
"""Knobs of a dynamic batcher whose smaller values only take serving capacity away (fewer
requests per model call): what the SLO rule compares (``slo_rule``)."""

ConfigKey: TypeAlias = tuple[tuple[str, str, object], ...]


class SpaceExhausted(Conflict, RuntimeError):
    """Every configuration the strategy may propose has been tried or excluded (a conflict
    with the study's state, not bad input: the API answers 409)."""


def _plain(value: object) -> object:
    # numpy scalars from callers become plain Python numbers (JSON, equality, hashing).
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


@dataclass(frozen=True, slots=True)
class Observation:
    """One trial as strategies see it: frozen, with a value only when it is trusted.

    ``number``: order within the study (the bandit's notion of age; prior-job observations from
    :func:`warm_start` have negative numbers). ``state``: ``running`` (proposed, not measured),
    ``complete`` (``value`` set), ``infeasible`` (out of memory, SLO violated, crashed on start:
    ``reason`` says which, :data:`REASON_OOM` for out of memory) or ``failed`` (no trustworthy
    measurement, e.g. noise never settled; says nothing about the configuration's quality).
    ``context``: conditions during the trial (load, contention) for contextual strategies.
    ``prior``: from an earlier job with the same model signature and hardware.
    """

    number: int
    config: Mapping[str, ParamValue]
    state: TrialState
    value: float | None = None
    stderr: float | None = None
    reason: str = ""
    context: Mapping[str, float] = field(default_factory=dict)
    prior: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.number, bool) or not isinstance(self.number, int | np.integer):
            raise ValueError(f"observation number must be an integer, got {self.number!r}")
        object.__setattr__(self, "number", int(self.number))
        if self.state not in TRIAL_STATES:
            raise ValueError(
                f"trial {self.number}: unknown state {self.state!r}; known: {TRIAL_STATES}"
            )
        if not isinstance(self.config, Mapping):
            raise ValueError(f"trial {self.number}: config must be a mapping")
        config = {str(k): _plain(v) for k, v in self.config.items()}
        object.__setattr__(self, "config", MappingProxyType(config))
        value = _plain(self.value)
        if self.state == "complete":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"trial {self.number}: a complete trial needs a numeric value")
            if not math.isfinite(value):
                raise ValueError(f"trial {self.number}: value {value} is not finite")
            object.__setattr__(self, "value", float(value))
        elif value is not None:
            # "Missing or stale measurements never become a trial value": only complete has one.
            raise ValueError(f"trial {self.number}: a {self.state} trial has no value")
        stderr = _plain(self.stderr)
        if stderr is not None:
            if not isinstance(stderr, int | float) or not math.isfinite(stderr) or stderr < 0:
                raise ValueError(f"trial {self.number}: stderr must be finite and >= 0")
            object.__setattr__(self, "stderr", float(stderr))
        context: dict[str, float] = {}
        for key, raw in self.context.items():
            item = _plain(raw)
            if not isinstance(item, int | float) or not math.isfinite(item):
                raise ValueError(f"trial {self.number}: context {key!r} must be a finite number")
            context[str(key)] = float(item)
        object.__setattr__(self, "context", MappingProxyType(context))

    def __hash__(self) -> int:
        return hash((self.number, config_key(self.config), self.state, self.value, self.prior))

    @property
    def is_oom(self) -> bool:
        return self.state == "infeasible" and self.reason == REASON_OOM


def config_key(config: Mapping[str, object]) -> ConfigKey:
    """A hashable identity of a configuration; type-tagged so that 1, 1.0 and True differ."""
    return tuple((name, type(value).__name__, value) for name, value in sorted(config.items()))


def tried_keys(history: Iterable[Observation]) -> set[ConfigKey]:
    """Configurations this study already ran or is running (prior jobs' trials excluded)."""
    return {config_key(o.config) for o in history if not o.prior}


def oom_rule(
    space: SearchSpace, history: Iterable[Observation]
) -> Callable[[Mapping[str, object]], bool]:
    """``dominated(config)``: would ``config`` run out of memory too?

    Peak memory grows with the per-device batch (activations) and, to first order, with
    nothing else we tune: the sync period reuses the same gradient buffers (accumulation) or
    the same model state (local SGD), and DDP's buckets together hold one copy of the gradients
    whatever their size. So an OOM at ``batch`` excludes every configuration with
    ``batch_size >= batch`` and the same values of the other parameters, whatever its
    ``sync_period`` and ``bucket_mb``. Without a ``batch_size`` parameter only the exact
    configuration is excluded.
    """
    ooms = [dict(o.config) for o in history if o.is_oom]
    if BATCH_SIZE not in space:
        keys = {config_key(c) for c in ooms}
        return lambda config: config_key(config) in keys
    fixed = [n for n in space.names if n not in (BATCH_SIZE, SYNC_PERIOD, BUCKET_MB)]

    def dominated(config: Mapping[str, object]) -> bool:
        return any(
            _ge(config.get(BATCH_SIZE), oom.get(BATCH_SIZE))
            and all(config.get(n) == oom.get(n) for n in fixed)
            for oom in ooms
        )

    return dominated


def slo_rule(
    space: SearchSpace, history: Iterable[Observation]
) -> Callable[[Mapping[str, object]], bool]:
    """``dominated(config)``: would ``config`` break the latency SLO too?

    A dynamic batcher's capacity shrinks, and its wait grows, with its largest batch and with
    how long it waits to fill one (:data:`CAPACITY_KNOBS`). So an **overload** breach
    (:data:`REASON_OVERLOAD`: the configuration could not carry the load) excludes every
    configuration that batches no more in each capacity knob, and a **wait** breach
    (:data:`REASON_WAIT`) every configuration that batches no less, both with the same values
    of the other parameters, as the OOM rule excludes larger batches. Other SLO breaches, and a
    space without a capacity knob, exclude nothing beyond the configurations tried."""
    knobs = [n for n in space.names if n in CAPACITY_KNOBS]
    smaller: list[dict[str, object]] = []
    larger: list[dict[str, object]] = []
    for o in history:
        if o.state != "infeasible" or o.prior:
            continue
        if o.reason.startswith(REASON_OVERLOAD):
            smaller.append(dict(o.config))
        elif o.reason.startswith(REASON_WAIT):
            larger.append(dict(o.config))
    if not knobs or not (smaller or larger):
        return lambda config: False
    fixed = [n for n in space.names if n not in knobs]

    def same_rest(config: Mapping[str, object], breach: Mapping[str, object]) -> bool:
        return all(config.get(n) == breach.get(n) for n in fixed)

    def dominated(config: Mapping[str, object]) -> bool:
        return any(
            all(_ge(b.get(n), config.get(n)) for n in knobs) and same_rest(config, b)
            for b in smaller
        ) or any(
            all(_ge(config.get(n), b.get(n)) for n in knobs) and same_rest(config, b)
            for b in larger
        )

    return dominated


def excluded_rule(
    space: SearchSpace, history: Iterable[Observation]
) -> Callable[[Mapping[str, object]], bool]:
    """``excluded(config)``: the OOM rule or the SLO rule excludes ``config``."""
    observed = list(history)
    oom, slo = oom_rule(space, observed), slo_rule(space, observed)
    return lambda config: oom(config) or slo(config)


def _ge(a: object, b: object) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a >= b


def best_observation(
    history: Iterable[Observation], direction: Direction, *, include_prior: bool = False
) -> Observation | None:
    """The complete observation with the best value (the earliest on ties), or ``None``."""
    complete = [o for o in history if o.state == "complete" and (include_prior or not o.prior)]
    if not complete:
        return None
    sign = 1.0 if direction == "maximize" else -1.0
    return max(complete, key=lambda o: (sign * (o.value or 0.0), -o.number))


@dataclass(frozen=True, slots=True)
class BestEstimate:
    """The configuration a study would keep: ``value`` and ``stderr`` pool its complete trials
    (``trials``, their numbers) by inverse-variance weighting."""

    config: Mapping[str, ParamValue]
    value: float
    stderr: float
    trials: tuple[int, ...]


def best_estimate(
    history: Iterable[Observation],
    direction: Direction,
    *,
    z: float = 1.0,
    include_prior: bool = False,
) -> BestEstimate | None:
    """The configuration whose pooled value is best by a pessimistic margin of ``z`` standard
    errors (``value - z * stderr`` when maximizing), or ``None`` without a complete trial.

    A trial accepted as noisy can come out high by luck; ranking on its raw value would keep a
    lucky measurement over a precise one that is as good. With the margin a noisy trial wins
    only when it beats the precise one by more than its own error bar, and with equal errors
    (or none, as told by an agent without a stderr) the order is the values' order. Repeats of
    a configuration are pooled, so a re-measured configuration earns a smaller error. Ties go
    to the earliest trial."""
    groups: dict[ConfigKey, list[Observation]] = {}
    for obs in history:
        if obs.state == "complete" and (include_prior or not obs.prior):
            groups.setdefault(config_key(obs.config), []).append(obs)
    if not groups:
        return None
    sign = 1.0 if direction == "maximize" else -1.0
    estimates = [_pooled(trials) for trials in groups.values()]
    return max(estimates, key=lambda e: (sign * e.value - z * e.stderr, -min(e.trials)))


def _pooled(trials: Sequence[Observation]) -> BestEstimate:
    values = np.asarray([o.value or 0.0 for o in trials])
    errors = np.asarray([o.stderr or 0.0 for o in trials])
    if np.all(errors > 0):
        weights = 1.0 / errors**2
        value = float((weights * values).sum() / weights.sum())
        stderr = float(1.0 / math.sqrt(weights.sum()))
    else:  # an error bar is unknown: the plain mean and what is known of its error
        value = float(values.mean())
        stderr = float(math.sqrt(float((errors**2).sum())) / len(trials))
    numbers = tuple(o.number for o in trials)
    return BestEstimate(trials[-1].config, value, stderr, numbers)


def warm_start(prior: Iterable[Observation], space: SearchSpace) -> tuple[Observation, ...]:
    """Observations of earlier jobs (same model signature and hardware) ready to prepend to a
    new study's history: complete and infeasible ones whose configuration is in ``space``,
    marked ``prior`` and renumbered ``-n .. -1`` in their original order so that they are
    older than any trial of the new study and never clash with its numbers. Running and failed
    trials carry no information and are dropped."""
    kept = [
        o
        for o in sorted(prior, key=lambda o: o.number)
        if o.state in ("complete", "infeasible") and space.contains(o.config)
    ]
    n = len(kept)
    return tuple(replace(o, number=i - n, prior=True) for i, o in enumerate(kept))


@runtime_checkable
class Strategy(Protocol):
    """Propose the next configuration from the study's history. No I/O, no hidden state."""

    space: SearchSpace
    direction: Direction

    def ask(
        self, history: Sequence[Observation], context: Mapping[str, float] | None = None
    ) -> dict[str, ParamValue]:
        """``history``: every trial of the study so far (plus :func:`warm_start` observations),
        in any order. ``context``: the current conditions (load, contention) for contextual
        strategies; the others ignore it. Returns a validated config of plain Python values;
        raises :class:`SpaceExhausted` when nothing is left to propose."""
        ...


class BaseStrategy(abc.ABC):
    """Shared plumbing: argument checks, history normalisation, seeded randomness."""

    name: ClassVar[str]

    def __init__(
        self, space: SearchSpace, *, direction: Direction = "maximize", seed: int | None = None
    ) -> None:
        if not isinstance(space, SearchSpace):
            raise TypeError(f"space must be a SearchSpace, got {type(space).__name__}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        self.space = space
        self.direction: Direction = check_direction(direction)
        self.seed = seed

    def ask(
        self, history: Sequence[Observation], context: Mapping[str, float] | None = None
    ) -> dict[str, ParamValue]:
        ordered = self._normalise(history)
        # The matrices here have at most a few thousand rows: BLAS threads cost more in
        # start-up and synchronisation than they save, and on a busy host they made one
        # Bayesian ask 5-10x slower. The limit holds only for the duration of the ask.
        with threadpool_limits(limits=1, user_api="blas"):
            config = self._ask(ordered, dict(context) if context else None)
        return self.space.validate(config)

    @abc.abstractmethod
    def _ask(
        self, history: Sequence[Observation], context: Mapping[str, float] | None
    ) -> Mapping[str, ParamValue]:
        """``history`` is sorted by number, prior observations outside the space dropped."""

    def _normalise(self, history: Sequence[Observation]) -> list[Observation]:
        ordered: list[Observation] = []
        numbers: set[int] = set()
        for obs in history:
            if not isinstance(obs, Observation):
                raise TypeError(f"history items must be Observation, got {type(obs).__name__}")
            if obs.number in numbers:
                raise ValueError(f"duplicate trial number {obs.number} in history")
            numbers.add(obs.number)
            if obs.prior:
                if self.space.contains(obs.config):
                    ordered.append(obs)
                continue
            self.space.validate(obs.config)  # a study's own trial outside its space is a bug
            ordered.append(obs)
        ordered.sort(key=lambda o: o.number)
        return ordered

    def _rng(self, history: Sequence[Observation], salt: int = 0) -> np.random.Generator:
        # Derived from the seed and the history length: the same history gives the same
        # proposal (a restart repeats nothing new), the next trial gets a fresh stream.
        if self.seed is None:
            return np.random.default_rng()
        return np.random.default_rng([self.seed, len(history), salt])

    def _sign(self) -> float:
        """Multiplier that turns a value into a score to maximize."""
        return 1.0 if self.direction == "maximize" else -1.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(direction={self.direction!r}, seed={self.seed!r})"
