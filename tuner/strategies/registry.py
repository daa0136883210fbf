"""Strategy names -> factories. The name is what ``Study.strategy`` stores."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from tuneloop.errors import InvalidInput
from tuneloop.strict import refuse_unknown_keys
from tuner.objectives import Direction
from tuner.space import SearchSpace
from tuner.strategies.bandit import AdaptiveBandit
from tuner.strategies.base import BaseStrategy
from tuner.strategies.bayesian import BayesianOptimization
from tuner.strategies.grid import GridSearch
from tuner.strategies.random_search import RandomSearch

Factory = Callable[..., BaseStrategy]

STRATEGIES: Mapping[str, type[BaseStrategy]] = {
    cls.name: cls for cls in (BayesianOptimization, AdaptiveBandit, GridSearch, RandomSearch)
}


class UnknownStrategyError(InvalidInput):
    """No strategy of that name, or options it does not take."""


def strategy_names() -> list[str]:
    return sorted(STRATEGIES)


def make_strategy(
    name: str,
    space: SearchSpace,
    *,
    direction: Direction = "maximize",
    seed: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> BaseStrategy:
    """Build the strategy called ``name``; ``options`` are its own keyword arguments (checked
    against its signature, so a typo is refused instead of silently ignored)."""
    try:
        cls = STRATEGIES[name]
    except (KeyError, TypeError):
        raise UnknownStrategyError(
            f"unknown strategy {name!r}; known: {', '.join(strategy_names())}"
        ) from None
    options = dict(options or {})
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "space"}
    refuse_unknown_keys(
        options,
        accepted,
        error=UnknownStrategyError,
        where=f"strategy {name!r}",
        # direction and seed are the study's, not options.
        message=f"{{path}} has no option {{unknown_joined}}; it takes "
        f"{', '.join(sorted(accepted - {'direction', 'seed'}))}",
    )
    return cls(space, direction=direction, seed=seed, **options)
