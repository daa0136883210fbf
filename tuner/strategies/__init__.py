"""Search strategies behind one ask interface (see ``base.Strategy``)."""

from tuner.strategies.bandit import AdaptiveBandit
from tuner.strategies.base import (
    REASON_OOM,
    REASON_SLO,
    BaseStrategy,
    BestEstimate,
    Observation,
    SpaceExhausted,
    Strategy,
    best_estimate,
    best_observation,
    excluded_rule,
    oom_rule,
    slo_rule,
    warm_start,
)
from tuner.strategies.bayesian import BayesianOptimization
from tuner.strategies.grid import GridSearch
from tuner.strategies.random_search import RandomSearch
from tuner.strategies.registry import (
    STRATEGIES,
    UnknownStrategyError,
    make_strategy,
    strategy_names,
)

__all__ = [
    "REASON_OOM",
    "REASON_SLO",
    "STRATEGIES",
    "AdaptiveBandit",
    "BaseStrategy",
    "BayesianOptimization",
    "BestEstimate",
    "GridSearch",
    "Observation",
    "RandomSearch",
    "SpaceExhausted",
    "Strategy",
    "UnknownStrategyError",
    "best_estimate",
    "best_observation",
    "excluded_rule",
    "make_strategy",
    "oom_rule",
    "slo_rule",
    "strategy_names",
    "warm_start",
]
