"""Typed, validated search spaces and the learning-rate rule that travels with a proposal.

A space is a tuple of parameters (integer or categorical, :mod:`tuner.params`) plus, for
training jobs, the rule that rescales the learning rate whenever the effective batch changes
(:mod:`tuner.effective_batch`). Everything here is pure and JSON-able (``to_dict``/``from_dict``
is what ``Study.space`` stores); a bad space is refused at construction with one
:class:`SpaceError` naming the parameter and the problem.

The lattice (:mod:`tuner.lattice`): every parameter has a finite, ordered set of values
(``IntParam.values``; all of them for small ranges and powers of two, evenly spaced in linear
or log scale otherwise). The grid, the bandit's arms, ``neighbours`` and the distances used for
infeasibility handling are all expressed on that lattice, so "one step" means the same thing
everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from tuneloop.learning_rate import LR_SCALINGS, SYNC_MODES, LrScaling, SyncMode, scaled_lr
from tuner import lattice
from tuner.effective_batch import (
    BATCH_SIZE,
    BUCKET_MB,
    SYNC_PERIOD,
    effective_batch,
    lr_batch,
    max_batch_for_memory,
)
from tuner.lattice import DEFAULT_RESOLUTION, MAX_GRID
from tuner.params import (
    CategoricalParam,
    Config,
    IntParam,
    Param,
    ParamValue,
    SpaceError,
    describe_param,
    is_int,
    param_from_dict,
)

__all__ = [
    "BATCH_SIZE",
    "BUCKET_MB",
    "DEFAULT_RESOLUTION",
    "MAX_GRID",
    "POWER_LIMIT_W",
    "SYNC_PERIOD",
    "CategoricalParam",
    "Config",
    "IntParam",
    "Param",
    "ParamValue",
    "SearchSpace",
    "SpaceError",
    "max_batch_for_memory",
    "power_limit_param",
]

_FORMAT_VERSION = 1

POWER_LIMIT_W = "power_limit_w"
"""The GPUs' power limit in whole watts: the key the job's agent applies through NVML
(``tuneloop.agent.power.POWER_LIMIT_KEY``, the same text; the tuner imports nothing of the
agent's)."""


def power_limit_param(low_w: int, high_w: int) -> IntParam:
    """The power-limit knob over ``[low_w, high_w]`` watts, on a linear scale (samples per
    joule changes smoothly with the limit). Take the bounds from the range the device reports,
    which the agent registers (docs/energy.md): a limit outside it is refused by the agent."""
    return IntParam(POWER_LIMIT_W, low_w, high_w)


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
        if not is_int(self.base_batch) or self.base_batch < 1:
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
            tuple(param_from_dict(p) for p in raw),
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
                raise SpaceError(f"{param.name}={value!r} is outside {describe_param(param)}")
            # contains() checked the type: an int for IntParam, one of the choices otherwise.
            result[param.name] = int(value) if is_int(value) else cast(ParamValue, value)
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
        return lattice.grid(self.params, resolution)

    def grid_size(self, resolution: int | None = DEFAULT_RESOLUTION) -> int:
        return lattice.grid_size(self.params, resolution)

    def neighbours(
        self, config: Mapping[str, object], resolution: int | None = DEFAULT_RESOLUTION
    ) -> list[dict[str, ParamValue]]:
        """Configurations one lattice step from ``config`` in exactly one parameter, see
        :func:`tuner.lattice.neighbours`."""
        return lattice.neighbours(self.params, self.validate(config), resolution)

    def lattice_coordinates(
        self, configs: Sequence[Mapping[str, object]], resolution: int | None = DEFAULT_RESOLUTION
    ) -> np.ndarray:
        """Positions in lattice-step units, shape ``(len(configs), d)``, see
        :func:`tuner.lattice.lattice_coordinates`."""
        return lattice.lattice_coordinates(self.params, configs, resolution)

    # ------------------------------------------------------------------ batch and learning rate

    def effective_batch(self, config: Mapping[str, object], ranks: int) -> int:
        """``batch_size * ranks * sync_period``: samples per gradient synchronisation, see
        :func:`tuner.effective_batch.effective_batch`."""
        return effective_batch(config, ranks)

    def lr_batch(self, config: Mapping[str, object], ranks: int) -> int:
        """The batch one optimizer step sees, which is what the learning rate scales with
        (:func:`tuner.effective_batch.lr_batch`: ``sync_mode`` decides whether ``sync_period``
        counts)."""
        return lr_batch(config, ranks, self.sync_mode)

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
        if b0 is None or not is_int(b0) or b0 < 1:
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


def _bounds(name: str, bounds: Sequence[int]) -> tuple[int, int]:
    if isinstance(bounds, str | bytes) or not isinstance(bounds, Sequence):
        raise SpaceError(f"{name}: bounds must be a (low, high) pair, got {bounds!r}")
    if len(bounds) != 2:
        raise SpaceError(f"{name}: empty bounds, need (low, high), got {tuple(bounds)!r}")
    return bounds[0], bounds[1]
