"""Grid search: every lattice configuration once, in a fixed order.

The order is :meth:`SearchSpace.grid`'s (first parameter slowest). Configurations already tried
in this study and those the OOM rule excludes are skipped, so a resumed study continues where it
stopped. When nothing is left, :class:`SpaceExhausted` names the best configuration found.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tuner.objectives import Direction
from tuner.space import DEFAULT_RESOLUTION, ParamValue, SearchSpace
from tuner.strategies.base import (
    BaseStrategy,
    Observation,
    SpaceExhausted,
    best_observation,
    config_key,
    excluded_rule,
    tried_keys,
)


class GridSearch(BaseStrategy):
    name = "grid"

    def __init__(
        self,
        space: SearchSpace,
        *,
        direction: Direction = "maximize",
        seed: int | None = None,
        resolution: int | None = DEFAULT_RESOLUTION,
    ) -> None:
        super().__init__(space, direction=direction, seed=seed)
        self.resolution = resolution
        self._grid = space.grid(resolution)  # validated here: an oversized grid fails at start

    def _ask(
        self, history: Sequence[Observation], context: Mapping[str, float] | None
    ) -> Mapping[str, ParamValue]:
        tried = tried_keys(history)
        dominated = excluded_rule(self.space, history)
        for config in self._grid:
            if config_key(config) not in tried and not dominated(config):
                return config
        best = best_observation(history, self.direction)
        found = (
            f"; best: {dict(best.config)} = {best.value:g}"
            if best and best.value is not None
            else ""
        )
        raise SpaceExhausted(f"grid of {len(self._grid)} configurations exhausted{found}")
