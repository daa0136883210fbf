"""Typed, validated search spaces and the learning-rate rule that travels with a proposal.

A space is a tuple of parameters (integer or categorical) plus, for training jobs, the rule that
rescales the learning rate whenever the effective batch changes. Everything here is pure and
JSON-able (``to_dict``/``from_dict`` is what ``Study.space`` stores); a bad space is refused at
construction with one :class:`SpaceError` naming the parameter and the problem.

The lattice: every parameter has a finite, ordered set of values (``IntParam.values``; all of
them for small ranges and powers of two, evenly spaced in linear or log scale otherwise). The
grid, the bandit's arms, ``neighbours`` and the distances used for infeasibility handling are all
expressed on that lattice, so "one step" means the same thing everywhere.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeGuard, cast

import numpy as np

from tuneloop.errors import InvalidInput
from tuneloop.learning_rate import LR_SCALINGS, SYNC_MODES, LrScaling, SyncMode, scaled_lr
from tuneloop.learning_rate import lr_batch as rule_lr_batch

ParamValue: TypeAlias = int | float | str | bool
Config: TypeAlias = Mapping[str, ParamValue]

# Names of the standard training parameters; the lr rule and the OOM rule look for these.
BATCH_SIZE = "batch_size"
SYNC_PERIOD = "sync_period"
BUCKET_MB = "bucket_mb"

DEFAULT_RESOLUTION = 16
"""Lattice points per integer parameter when a range is too wide to enumerate."""

MAX_GRID = 100_000
"""A grid larger than this is refused: it is a mistake, not a search."""

_FORMAT_VERSION = 1


class SpaceError(InvalidInput):
    """A search space or a configuration is invalid; the message names what and why."""


def _is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    # bool is an int subclass; a True batch size is a bug, not a 1.
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _check_name(name: object) -> str:
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
        _check_name(self.name)
        for bound in ("low", "high"):
            value = getattr(self, bound)
            if not _is_int(value):
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
        if not _is_int(value):
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
        _check_name(self.name)
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


def _param_from_dict(data: Mapping[str, Any]) -> Param:
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


@dataclass(frozen=True)
class SearchSpace:
    """The parameters of one study and the learning-rate rule of its proposals.

    ``lr_scaling``: ``"linear"`` (SGD, Goyal et al.), ``"sqrt"`` (Adam-style optimizers) or
    ``None`` (the proposal carries no learning rate). With a rule, ``base_lr`` is the learning
    rate tuned at the global batch ``base_batch`` (Pollux's M0), and a ``batch_size`` parameter is
    required. ``sync_mode`` says what ``sync_period`` means, see :meth:`lr_batch`.
    """

    params: tuple[Param, ...]
    lr_scaling: LrScaling | None = None
    base_lr: float | None = None
    base_batch: int | None = None
    sync_mode: SyncMode = "accumulate"
    _by_name: dict[str, Param] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.params, IntParam | CategoricalParam) or not isinstance(
            self.params, Iterable
        ):
            raise SpaceError("params must be a list of IntParam/CategoricalParam")
        params = tuple(self.params)
        if not params:
            raise SpaceError("a search space needs at least one parameter")
        by_name: dict[str, Param] = {}
        for param in params:
            if not isinstance(param, IntParam | CategoricalParam):
                raise SpaceError(f"not a parameter: {param!r}")
            if param.name in by_name:
                raise SpaceError(f"duplicate parameter name {param.name!r}")
            by_name[param.name] = param
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "_by_name", by_name)
        if self.sync_mode not in SYNC_MODES:
            raise SpaceError(f"unknown sync_mode {self.sync_mode!r} (accumulate, local_sgd)")
        if self.lr_scaling is None:
            return
        if self.lr_scaling not in LR_SCALINGS:
            raise SpaceError(f"unknown lr_scaling {self.lr_scaling!r} (linear, sqrt or None)")
        if self.base_lr is None or self.base_batch is None:
            raise SpaceError(
                f"lr_scaling {self.lr_scaling!r} needs base_lr and base_batch "
                "(the learning rate tuned at that global batch), or pass lr_scaling=None"
            )
        if not (isinstance(self.base_lr, int | float) and math.isfinite(self.base_lr)) or (
            self.base_lr <= 0
        ):
            raise SpaceError(f"base_lr must be a positive number, got {self.base_lr!r}")
        if not _is_int(self.base_batch) or self.base_batch < 1:
            raise SpaceError(f"base_batch must be a positive integer, got {self.base_batch!r}")
        object.__setattr__(self, "base_lr", float(self.base_lr))
        object.__setattr__(self, "base_batch", int(self.base_batch))
        if BATCH_SIZE not in by_name:
            raise SpaceError(f"lr_scaling needs a {BATCH_SIZE!r} parameter")

    # ------------------------------------------------------------------ construction

    @classmethod
    def training(
        cls,
        batch_size: Sequence[int],
        sync_period: Sequence[int] | None = None,
        bucket_mb: Sequence[int] | None = None,
        *,
        batch_powers_of_two: bool = True,
        sync_powers_of_two: bool = False,
        lr_scaling: LrScaling | None = "linear",
        base_lr: float | None = None,
        base_batch: int | None = None,
        sync_mode: SyncMode = "accumulate",
        extra: Sequence[Param] = (),
    ) -> SearchSpace:
        """The standard training space: ``batch_size`` (per device; powers of two, or log scale
        with ``batch_powers_of_two=False``), ``sync_period`` (micro-steps between gradient
        synchronisations; log scale, or powers of two with ``sync_powers_of_two=True``) and
        optionally ``bucket_mb`` (all-reduce bucket size, log scale).
        Bounds are ``(low, high)`` pairs, inclusive."""
        params: list[Param] = [
            IntParam(
                BATCH_SIZE,
                *_bounds(BATCH_SIZE, batch_size),
                log=not batch_powers_of_two,
                powers_of_two=batch_powers_of_two,
            )
        ]
        if sync_period is not None:
            # Log scale: its effect (amortising one all-reduce over k steps) is multiplicative.
            params.append(
                IntParam(
                    SYNC_PERIOD,
                    *_bounds(SYNC_PERIOD, sync_period),
                    log=True,
                    powers_of_two=sync_powers_of_two,
                )
            )
        if bucket_mb is not None:
            params.append(IntParam(BUCKET_MB, *_bounds(BUCKET_MB, bucket_mb), log=True))
        params.extend(extra)
        return cls(
            tuple(params),
            lr_scaling=lr_scaling,
            base_lr=base_lr,
            base_batch=base_batch,
            sync_mode=sync_mode,
        )

    def limit(self, name: str, high: int) -> SearchSpace:
        """This space with ``name``'s upper bound lowered to ``high`` (e.g. from memory headroom,
        see :func:`max_batch_for_memory`). Refused when nothing valid would be left."""
        param = self[name]
        if not isinstance(param, IntParam):
            raise SpaceError(f"{name}: only integer parameters can be limited")
        if high < param.low:
            raise SpaceError(f"{name}: limit {high} is below the lower bound {param.low}")
        new = IntParam(param.name, param.low, min(param.high, high), param.log, param.powers_of_two)
        params = tuple(new if p.name == name else p for p in self.params)
        return SearchSpace(params, self.lr_scaling, self.base_lr, self.base_batch, self.sync_mode)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": _FORMAT_VERSION,
            "params": [p.to_dict() for p in self.params],
            "lr_scaling": self.lr_scaling,
            "base_lr": self.base_lr,
            "base_batch": self.base_batch,
            "sync_mode": self.sync_mode,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        if not isinstance(data, Mapping):
            raise SpaceError(f"a search space must be an object, got {type(data).__name__}")
        version = data.get("version", _FORMAT_VERSION)
        if version != _FORMAT_VERSION:
            raise SpaceError(f"unsupported search space version {version!r}")
        raw = data.get("params")
        if not isinstance(raw, list):
            raise SpaceError("a search space needs a 'params' list")
        return cls(
            tuple(_param_from_dict(p) for p in raw),
            lr_scaling=data.get("lr_scaling"),
            base_lr=data.get("base_lr"),
            base_batch=data.get("base_batch"),
            sync_mode=data.get("sync_mode", "accumulate"),
        )

    # ------------------------------------------------------------------ configurations

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def __getitem__(self, name: str) -> Param:
        try:
            return self._by_name[name]
        except KeyError:
            raise SpaceError(f"no parameter {name!r} in {list(self.names)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def validate(self, config: Mapping[str, object]) -> dict[str, ParamValue]:
        """``config`` as a plain dict in parameter order (numpy ints become ``int``), or a
        :class:`SpaceError` naming the first problem."""
        if not isinstance(config, Mapping):
            raise SpaceError(f"a configuration must be a mapping, got {type(config).__name__}")
        extra = sorted(set(config) - set(self._by_name))
        if extra:
            raise SpaceError(f"unknown parameters {extra}; the space has {list(self.names)}")
        result: dict[str, ParamValue] = {}
        for param in self.params:
            if param.name not in config:
                raise SpaceError(f"missing parameter {param.name!r}")
            value = config[param.name]
            if not param.contains(value):
                raise SpaceError(f"{param.name}={value!r} is outside {_describe(param)}")
            # contains() checked the type: an int for IntParam, one of the choices otherwise.
            result[param.name] = int(value) if _is_int(value) else cast(ParamValue, value)
        return result

    def contains(self, config: Mapping[str, object]) -> bool:
        try:
            self.validate(config)
        except SpaceError:
            return False
        return True

    def sample(self, rng: np.random.Generator) -> dict[str, ParamValue]:
        return {p.name: p.sample(rng) for p in self.params}

    def from_unit(self, point: Sequence[float]) -> dict[str, ParamValue]:
        """The configuration at a point of the unit cube (one coordinate per parameter), each
        parameter on its own scale: how quasi-random designs become configurations."""
        if len(point) != len(self.params):
            raise SpaceError(f"need {len(self.params)} coordinates, got {len(point)}")
        return {p.name: p.from_unit(u) for p, u in zip(self.params, point, strict=True)}

    def grid(self, resolution: int | None = DEFAULT_RESOLUTION) -> list[dict[str, ParamValue]]:
        """Every lattice configuration, in a fixed order: the first parameter varies slowest."""
        axes = [p.values(resolution) for p in self.params]
        size = math.prod(len(a) for a in axes)
        if size > MAX_GRID:
            raise SpaceError(
                f"grid of {size} configurations exceeds {MAX_GRID}; lower the resolution"
            )
        return [dict(zip(self.names, combo, strict=True)) for combo in itertools.product(*axes)]

    def grid_size(self, resolution: int | None = DEFAULT_RESOLUTION) -> int:
        return math.prod(len(p.values(resolution)) for p in self.params)

    def neighbours(
        self, config: Mapping[str, object], resolution: int | None = DEFAULT_RESOLUTION
    ) -> list[dict[str, ParamValue]]:
        """Configurations one lattice step away in exactly one parameter: the next lattice
        value below and above for integers (a value between lattice points steps to the nearest
        ones), every other choice for categoricals. Fixed order, no duplicates."""
        base = self.validate(config)
        result: list[dict[str, ParamValue]] = []
        for param in self.params:
            value = base[param.name]
            if isinstance(param, IntParam):
                lattice = param.values(resolution)
                assert isinstance(value, int)
                below = [v for v in lattice if v < value]
                above = [v for v in lattice if v > value]
                steps: list[ParamValue] = [*below[-1:], *above[:1]]
            else:
                steps = [c for c in param.choices if param.index(c) != param.index(value)]
            result.extend({**base, param.name: step} for step in steps)
        return result

    def lattice_coordinates(
        self, configs: Sequence[Mapping[str, object]], resolution: int | None = DEFAULT_RESOLUTION
    ) -> np.ndarray:
        """Positions in lattice-step units, shape ``(len(configs), d)``.

        An integer parameter is one column: its position on its scale (log for log/powers of
        two) divided by the step of its lattice at ``resolution``, so adjacent lattice values
        are about 1 apart. A categorical parameter is one-hot over its choices scaled by
        ``1/sqrt(2)``, so two different choices are exactly 1 apart. Euclidean distances between
        rows are then "steps", the unit of the kernels in the strategies.
        """
        columns: list[np.ndarray] = []
        for param in self.params:
            if isinstance(param, IntParam):
                points = max(len(param.values(resolution)) - 1, 1)
                raw = np.fromiter((c[param.name] for c in configs), float, len(configs))
                columns.append((param.units(raw) * points)[:, None])
            else:
                onehot = np.zeros((len(configs), len(param.choices)))
                for row, config in enumerate(configs):
                    onehot[row, param.index(config[param.name])] = 1.0 / math.sqrt(2.0)
                columns.append(onehot)
        return np.hstack(columns) if columns else np.zeros((len(configs), 0))

    # ------------------------------------------------------------------ learning rate

    def effective_batch(self, config: Mapping[str, object], ranks: int) -> int:
        """Samples per gradient synchronisation: ``batch_size * ranks * sync_period``.

        This is Pollux's M (``atomic_bsz * replicas * (accum_steps + 1)``) and what statistical
        efficiency is computed on, in both sync modes (for local SGD it is the conservative
        choice: averaging after k local steps is at least as statistically efficient as one step
        on a batch k times larger, so goodput is never overestimated).
        """
        _check_ranks(ranks)
        batch = self._int(config, BATCH_SIZE)
        return batch * ranks * self._sync_period(config)

    def lr_batch(self, config: Mapping[str, object], ranks: int) -> int:
        """The batch one optimizer step sees, which is what the learning rate scales with
        (:func:`tuneloop.learning_rate.lr_batch`: ``sync_mode`` decides whether
        ``sync_period`` counts)."""
        _check_ranks(ranks)
        batch = self._int(config, BATCH_SIZE)
        return rule_lr_batch(batch, ranks, self._sync_period(config), self.sync_mode)

    def apply_lr_rule(
        self,
        config: Mapping[str, object],
        *,
        ranks: int,
        base_lr: float | None = None,
        base_batch: int | None = None,
    ) -> float | None:
        """The learning rate that goes with ``config``: ``base_lr * B/B0`` (linear) or
        ``base_lr * sqrt(B/B0)`` (sqrt) with B = :meth:`lr_batch`, B0 = ``base_batch``; the
        rule the job's agent applies too (:mod:`tuneloop.learning_rate`).
        ``base_lr``/``base_batch`` default to the space's own; ``None`` when the space has no
        rule (the job keeps its learning rate)."""
        if self.lr_scaling is None:
            return None
        lr = self.base_lr if base_lr is None else base_lr
        b0 = self.base_batch if base_batch is None else base_batch
        if lr is None or not math.isfinite(lr) or lr <= 0:
            raise SpaceError(f"base_lr must be a positive number, got {lr!r}")
        if b0 is None or not _is_int(b0) or b0 < 1:
            raise SpaceError(f"base_batch must be a positive integer, got {b0!r}")
        return scaled_lr(self.lr_scaling, lr, int(b0), self.lr_batch(config, ranks))

    def desired(self, config: Mapping[str, object], *, ranks: int) -> dict[str, ParamValue]:
        """``config`` validated, plus ``learning_rate`` when the space has a rule: what is
        written as the job's desired config, so a batch change never travels without its lr."""
        result = self.validate(config)
        lr = self.apply_lr_rule(result, ranks=ranks)
        if lr is not None:
            result["learning_rate"] = lr
        return result

    def _int(self, config: Mapping[str, object], name: str) -> int:
        value = config.get(name)
        if not _is_int(value) or int(value) < 1:
            raise SpaceError(f"{name} must be a positive integer, got {value!r}")
        return int(value)

    def _sync_period(self, config: Mapping[str, object]) -> int:
        return self._int(config, SYNC_PERIOD) if SYNC_PERIOD in config else 1


def max_batch_for_memory(
    memory_total_bytes: float,
    fixed_bytes: float,
    bytes_per_sample: float,
    headroom: float = 0.1,
) -> int:
    """Largest per-device batch whose estimated peak memory leaves ``headroom`` (a fraction of
    the device) free, with the linear model ``peak = fixed + bytes_per_sample * batch`` (weights,
    optimizer state and buffers are fixed; activations grow with the batch). Feed the result to
    :meth:`SearchSpace.limit`."""
    if not 0 <= headroom < 1:
        raise SpaceError(f"headroom must be in [0, 1), got {headroom}")
    if memory_total_bytes <= 0 or fixed_bytes < 0 or bytes_per_sample <= 0:
        raise SpaceError("memory sizes must be positive (fixed may be 0)")
    usable = memory_total_bytes * (1 - headroom) - fixed_bytes
    batch = math.floor(usable / bytes_per_sample)
    if batch < 1:
        raise SpaceError(
            f"no batch fits: {fixed_bytes:.3g} B fixed leaves {usable:.3g} B "
            f"for {bytes_per_sample:.3g} B per sample"
        )
    return batch


def _bounds(name: str, bounds: Sequence[int]) -> tuple[int, int]:
    if isinstance(bounds, str | bytes) or not isinstance(bounds, Sequence):
        raise SpaceError(f"{name}: bounds must be a (low, high) pair, got {bounds!r}")
    if len(bounds) != 2:
        raise SpaceError(f"{name}: empty bounds, need (low, high), got {tuple(bounds)!r}")
    return bounds[0], bounds[1]


def _describe(param: Param) -> str:
    if isinstance(param, CategoricalParam):
        return f"choices {list(param.choices)!r}"
    kind = " (powers of two)" if param.powers_of_two else ""
    return f"[{param.low}, {param.high}]{kind}"


def _check_ranks(ranks: int) -> None:
    if not _is_int(ranks) or ranks < 1:
        raise SpaceError(f"ranks must be a positive integer, got {ranks!r}")
