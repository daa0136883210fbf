"""The lattice of a search space: every parameter's finite, ordered values, and what is
expressed on them (the grid, the neighbours one step away, positions in lattice steps), so that
"one step" means the same thing to every strategy."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from tuner.params import IntParam, Param, ParamValue, SpaceError

DEFAULT_RESOLUTION = 16
"""Lattice points per integer parameter when a range is too wide to enumerate."""

MAX_GRID = 100_000
"""A grid larger than this is refused: it is a mistake, not a search."""


def grid(params: Sequence[Param], resolution: int | None) -> list[dict[str, ParamValue]]:
    """Every lattice configuration, in a fixed order: the first parameter varies slowest."""
    names = [p.name for p in params]
    axes = [p.values(resolution) for p in params]
    size = math.prod(len(a) for a in axes)
    if size > MAX_GRID:
        raise SpaceError(f"grid of {size} configurations exceeds {MAX_GRID}; lower the resolution")
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]


def grid_size(params: Sequence[Param], resolution: int | None) -> int:
    return math.prod(len(p.values(resolution)) for p in params)


def neighbours(
    params: Sequence[Param], base: Mapping[str, ParamValue], resolution: int | None
) -> list[dict[str, ParamValue]]:
    """Configurations one lattice step from the valid configuration ``base`` in exactly one
    parameter: the next lattice value below and above for integers (a value between lattice
    points steps to the nearest ones), every other choice for categoricals. Fixed order, no
    duplicates."""
    result: list[dict[str, ParamValue]] = []
    for param in params:
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
    params: Sequence[Param], configs: Sequence[Mapping[str, object]], resolution: int | None
) -> np.ndarray:
    """Positions in lattice-step units, shape ``(len(configs), d)``.

    An integer parameter is one column: its position on its scale (log for log/powers of
    two) divided by the step of its lattice at ``resolution``, so adjacent lattice values
    are about 1 apart. A categorical parameter is one-hot over its choices scaled by
    ``1/sqrt(2)``, so two different choices are exactly 1 apart. Euclidean distances between
    rows are then "steps", the unit of the kernels in the strategies.
    """
    columns: list[np.ndarray] = []
    for param in params:
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
