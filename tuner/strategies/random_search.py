"""Random search: the baseline every other strategy must beat.

Each parameter is drawn on its own scale (log-uniform for log integers, a uniform exponent for
powers of two, uniform otherwise), without replacement within the study: a configuration already
tried, or one that the OOM rule says would run out of memory, is drawn again. Once every
configuration was tried it samples again, with replacement, among those that completed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tuner.space import ParamValue
from tuner.strategies.base import (
    BaseStrategy,
    Observation,
    SpaceExhausted,
    config_key,
    excluded_rule,
)
from tuner.strategies.base import tried_keys as _tried_keys

_DRAWS = 200
"""Rejection-sampling attempts before falling back to enumerating what is left."""


class RandomSearch(BaseStrategy):
    name = "random"

    def _ask(
        self, history: Sequence[Observation], context: Mapping[str, float] | None
    ) -> Mapping[str, ParamValue]:
        rng = self._rng(history)
        tried = _tried_keys(history)
        dominated = excluded_rule(self.space, history)
        for _ in range(_DRAWS):
            config = self.space.sample(rng)
            if config_key(config) not in tried and not dominated(config):
                return config
        # Nearly everything is tried: pick uniformly among what is left on the full lattice.
        left = [
            c
            for c in self.space.grid(
                resolution=None if self.space.grid_size(None) <= 10_000 else 64
            )
            if config_key(c) not in tried and not dominated(c)
        ]
        if left:
            return left[int(rng.integers(len(left)))]
        # Everything was tried: sample with replacement among what completed, so that a
        # 15-trial baseline on a 12-configuration space keeps measuring instead of stopping.
        bad = {config_key(o.config) for o in history if o.state == "infeasible"}
        done = {
            config_key(o.config): dict(o.config)
            for o in history
            if o.state == "complete" and not o.prior and config_key(o.config) not in bad
        }
        if not done:
            raise SpaceExhausted(
                f"random search: nothing feasible left ({len(tried)} configurations tried)"
            )
        options = sorted(done.items())
        return options[int(rng.integers(len(options)))][1]
