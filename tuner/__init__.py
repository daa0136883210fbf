"""tuneloop tuner component: the pure logic of auto-tuning (no I/O, no database, no queue).

- ``space``: typed search spaces (per-device batch size, sync period, all-reduce bucket size)
  and the learning-rate rule that travels with every proposal;
- ``objectives``: goodput (Pollux), throughput, SLO-bounded throughput, P99 at an
  offered load (per load band, ``load_bands``), with directions;
- ``measurement``: turning a window of step samples into a trusted trial value, or a reason to
  wait, extend or fail;
- ``strategies``: Bayesian optimization, an adaptive bandit, random and grid search behind one
  stateless ``ask(history)`` interface;
- ``memory``: the GPU memory model (peak = fixed + per-sample x batch) and the batch bound it
  gives, passed to a strategy as predicted out-of-memory observations;
- ``diagnosis``: where a job's step time goes and what bounds it, which ranks lag (the rules,
  imported by name, not re-exported here).

The I/O side is in modules this package does not import: ``service`` (studies and trials in
the store), ``readings`` (measurements from the time-series store), ``loop`` (one reconcile
pass of the tuning loop), ``tasks`` (its periodic task), ``diagnosis_reading`` and
``diagnosis_series`` (a job's diagnosis from its series, and the gauges the periodic pass
writes of it). See docs/tuner.md and docs/diagnosis.md.
"""

from tuner.measurement import (
    MeasurementError,
    MeasurementPolicy,
    Sample,
    TrialVerdict,
    WindowStats,
    judge_window,
    window_stats,
)
from tuner.memory import (
    MemoryBound,
    MemoryModel,
    MemoryPoint,
    fit_memory_model,
    memory_bound,
    predicted_oom_observations,
)
from tuner.objectives import (
    OBJECTIVES,
    Evaluation,
    Objective,
    ObjectiveError,
    default_objective,
    get_objective,
    goodput,
    offered_load_p99,
    per_joule,
    slo_throughput,
    statistical_efficiency,
    throughput,
)
from tuner.space import (
    BATCH_SIZE,
    BUCKET_MB,
    POWER_LIMIT_W,
    SYNC_PERIOD,
    CategoricalParam,
    IntParam,
    SearchSpace,
    SpaceError,
    max_batch_for_memory,
    power_limit_param,
)
from tuner.strategies import (
    REASON_OOM,
    STRATEGIES,
    AdaptiveBandit,
    BaseStrategy,
    BayesianOptimization,
    GridSearch,
    Observation,
    RandomSearch,
    SpaceExhausted,
    Strategy,
    UnknownStrategyError,
    best_observation,
    make_strategy,
    strategy_names,
    warm_start,
)

__all__ = [
    "BATCH_SIZE",
    "BUCKET_MB",
    "OBJECTIVES",
    "POWER_LIMIT_W",
    "REASON_OOM",
    "STRATEGIES",
    "SYNC_PERIOD",
    "AdaptiveBandit",
    "BaseStrategy",
    "BayesianOptimization",
    "CategoricalParam",
    "Evaluation",
    "GridSearch",
    "IntParam",
    "MeasurementError",
    "MeasurementPolicy",
    "MemoryBound",
    "MemoryModel",
    "MemoryPoint",
    "Objective",
    "ObjectiveError",
    "Observation",
    "RandomSearch",
    "Sample",
    "SearchSpace",
    "SpaceError",
    "SpaceExhausted",
    "Strategy",
    "TrialVerdict",
    "UnknownStrategyError",
    "WindowStats",
    "best_observation",
    "default_objective",
    "fit_memory_model",
    "get_objective",
    "goodput",
    "judge_window",
    "make_strategy",
    "max_batch_for_memory",
    "memory_bound",
    "offered_load_p99",
    "per_joule",
    "power_limit_param",
    "predicted_oom_observations",
    "slo_throughput",
    "statistical_efficiency",
    "strategy_names",
    "throughput",
    "warm_start",
    "window_stats",
]
