"""The memory model and the batch bound (pure, table-driven), and how the bound reaches each
strategy: as predicted out-of-memory observations that its OOM rule already honours."""

from __future__ import annotations

import re

import pytest

from tuneloop.storage.models import Trial
from tuner.memory import (
    MAX_PREDICTED_OOMS,
    MemoryModelError,
    MemoryPoint,
    combinations,
    first_excluded_batch,
    fit_memory_model,
    memory_bound,
    predicted_oom_observations,
)
from tuner.service import memory_points
from tuner.space import CategoricalParam, IntParam, Param, SearchSpace
from tuner.strategies.base import Observation, oom_rule
from tuner.strategies.registry import make_strategy

H100 = 81559.0  # MiB, DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE of an H100 80GB


def points(*pairs: tuple[int, float], capacity: float = H100) -> list[MemoryPoint]:
    return [MemoryPoint(i + 1, b, m, capacity) for i, (b, m) in enumerate(pairs)]


@pytest.mark.parametrize(
    ("measured", "headroom", "max_batch", "fixed", "per_sample"),
    [
        # 8000 MiB fixed + 250 MiB/sample: (81559 * 0.9 - 8000) / 250 = 261.6
        (points((8, 10000), (16, 12000), (32, 16000)), 0.1, 261, 8000, 250),
        # no headroom: (81559 - 8000) / 250 = 294.2
        (points((8, 10000), (32, 16000)), 0.0, 294, 8000, 250),
        # half the device kept free: (40779.5 - 8000) / 250 = 131.1
        (points((8, 10000), (32, 16000)), 0.5, 131, 8000, 250),
        # noisy repeats at one batch: least squares through their mean
        (points((8, 10100), (8, 9900), (16, 12000), (32, 16000)), 0.1, 261, 8000, 250),
        # the fixed part alone leaves no room: nothing fits (0, never negative)
        (points((1, 75000), (2, 76000)), 0.1, 0, 74000, 1000),
    ],
)
def test_bound_from_the_fitted_model(
    measured: list[MemoryPoint], headroom: float, max_batch: int, fixed: float, per_sample: float
) -> None:
    bound = memory_bound(measured, headroom)
    assert bound.applies and bound.max_batch == max_batch
    assert bound.model is not None
    assert bound.model.fixed_mib == pytest.approx(fixed)
    assert bound.model.per_sample_mib == pytest.approx(per_sample)
    assert bound.capacity_mib == H100
    assert bound.limit_mib == pytest.approx(H100 * (1 - headroom))
    figures = bound.to_dict()
    assert figures["max_batch"] == max_batch and figures["headroom"] == headroom
    assert [p["batch"] for p in figures["points"]] == [p.batch for p in measured]
    assert f"up to batch {max_batch}" in bound.why


@pytest.mark.parametrize(
    ("measured", "why"),
    [
        ([], r"2 distinct batch sizes, has 0"),
        (points((16, 12000)), r"2 distinct batch sizes, has 1 \(\[16\]\)"),
        (points((16, 12000), (16, 12100)), r"has 1 \(\[16\]\)"),
        # the caching allocator held the same pool whatever the batch
        (points((8, 30000), (64, 30000)), "does not grow with the batch"),
        (points((8, 30000), (64, 29000)), "does not grow with the batch"),
    ],
)
def test_no_bound_without_a_slope(measured: list[MemoryPoint], why: str) -> None:
    bound = memory_bound(measured)
    assert not bound.applies and bound.max_batch is None
    assert bound.to_dict()["max_batch"] is None
    assert re.search(why, bound.why), bound.why


def test_smallest_device_bounds_the_batch() -> None:
    mixed = [MemoryPoint(1, 8, 10000, H100), MemoryPoint(2, 32, 16000, 40960)]
    bound = memory_bound(mixed, 0.1)
    assert bound.capacity_mib == 40960
    assert bound.max_batch == (40960 * 0.9 - 8000) // 250


def test_fit_reports_its_worst_residual() -> None:
    model = fit_memory_model(points((8, 10000), (16, 12400), (32, 16000)))
    assert model is not None and model.batches == (8, 16, 32) and model.points == 3
    assert model.max_residual_mib > 100
    assert model.predict(64) == pytest.approx(model.fixed_mib + 64 * model.per_sample_mib)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"batch": 0, "peak_mib": 1.0, "capacity_mib": 2.0}, "batch must be a positive"),
        ({"batch": True, "peak_mib": 1.0, "capacity_mib": 2.0}, "batch must be a positive"),
        ({"batch": 8, "peak_mib": float("nan"), "capacity_mib": 2.0}, "peak_mib must be"),
        ({"batch": 8, "peak_mib": 1.0, "capacity_mib": 0.0}, "capacity_mib must be > 0"),
    ],
)
def test_bad_points_are_refused(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(MemoryModelError, match=error):
        MemoryPoint(trial=1, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("headroom", [-0.1, 1.0, 2])
def test_bad_headroom_is_refused(headroom: float) -> None:
    with pytest.raises(MemoryModelError, match="headroom must be in"):
        memory_bound(points((8, 1.0), (16, 2.0)), headroom)


POWERS = IntParam("batch_size", 8, 256, powers_of_two=True)
LOG = IntParam("batch_size", 10, 200, log=True)


@pytest.mark.parametrize(
    ("param", "max_batch", "excluded"),
    [
        (POWERS, 100, 128),
        (POWERS, 128, 256),
        (POWERS, 256, None),
        (POWERS, 1000, None),
        (POWERS, 4, 16),  # below the space: its smallest batch stays
        (POWERS, 0, 16),
        (LOG, 100, 101),
        (LOG, 199, 200),
        (LOG, 200, None),
        (LOG, 5, 11),
    ],
)
def test_first_excluded_batch(param: IntParam, max_batch: int, excluded: int | None) -> None:
    assert first_excluded_batch(param, max_batch) == excluded


SPACE = SearchSpace.training((8, 256), (1, 8), base_lr=0.1, base_batch=64)


def test_predicted_ooms_exclude_what_the_bound_excludes() -> None:
    [predicted] = predicted_oom_observations(SPACE, 100, first_number=-3)
    assert predicted.number == -3 and predicted.prior and predicted.is_oom
    assert predicted.config["batch_size"] == 128
    dominated = oom_rule(SPACE, [predicted])
    for sync in (1, 2, 8):
        assert dominated({"batch_size": 128, "sync_period": sync})
        assert dominated({"batch_size": 256, "sync_period": sync})
        assert not dominated({"batch_size": 64, "sync_period": sync})
    assert predicted_oom_observations(SPACE, 256, first_number=-1) == ()


def test_one_predicted_oom_per_value_of_the_other_parameters() -> None:
    space = SearchSpace((POWERS, CategoricalParam("precision", ("bf16", "fp32"))), lr_scaling=None)
    predicted = predicted_oom_observations(space, 64, first_number=-1)
    assert [(o.number, o.config["precision"]) for o in predicted] == [(-1, "bf16"), (-2, "fp32")]
    dominated = oom_rule(space, predicted)
    assert dominated({"batch_size": 128, "precision": "fp32"})
    assert not dominated({"batch_size": 64, "precision": "bf16"})


def test_no_batch_parameter_no_prediction() -> None:
    space = SearchSpace((IntParam("sync_period", 1, 8),), lr_scaling=None)
    assert predicted_oom_observations(space, 4, first_number=-1) == ()


@pytest.mark.parametrize("name", ["random", "grid", "bayesian", "bandit"])
def test_strategies_never_propose_past_the_bound(name: str) -> None:
    space = SearchSpace.training((8, 256), (1, 4), sync_powers_of_two=True, lr_scaling=None)
    strategy = make_strategy(name, space, seed=1)
    predicted = predicted_oom_observations(space, 100, first_number=-1)
    history: list[Observation] = []
    for number in range(1, 9):
        config = strategy.ask([*predicted, *history])
        assert isinstance(config["batch_size"], int) and config["batch_size"] <= 64, config
        value = float(config["batch_size"]) * (1 + 0.1 * float(config["sync_period"]))
        history.append(Observation(number, config, "complete", value=value))


@pytest.mark.parametrize(
    ("extra", "count"),
    [
        ((), 1),
        ((CategoricalParam("precision", ("bf16", "fp32")),), 2),
        ((IntParam("layers_checkpointed", 0, 9), CategoricalParam("z", (1, 2, 3))), 30),
        ((IntParam("wide", 1, 10**9),), 10**9),
    ],
)
def test_combinations_of_the_held_parameters(extra: tuple[Param, ...], count: int) -> None:
    space = SearchSpace((POWERS, IntParam("sync_period", 1, 8), *extra), lr_scaling=None)
    assert combinations(space) == count
    predicted = predicted_oom_observations(space, 64, first_number=-1)
    assert len(predicted) == (count if count <= MAX_PREDICTED_OOMS else 0)


def trial(number: int, state: str, batch: object, reading: object, reason: str = "") -> Trial:
    data = {} if reading is None else {"gpu_memory": reading}
    return Trial(
        number=number,
        state=state,
        params={"batch_size": batch, "sync_period": 1, "learning_rate": 0.1},
        measurements={"context": {}, "stderr": None, "reason": reason, "data": data},
    )


GOOD = {"peak_mib": 12000.0, "capacity_mib": H100, "gpus": []}


@pytest.mark.parametrize(
    ("row", "used"),
    [
        (trial(1, "complete", 16, GOOD), True),
        (trial(2, "failed", 16, GOOD, "gave up after 2 extensions"), True),  # it ran
        (trial(3, "running", 16, GOOD), False),
        (trial(4, "infeasible", 16, GOOD, "oom"), False),  # the OOM rule covers it
        (trial(5, "complete", 16, None), False),  # no GPU series
        (trial(6, "complete", 16, {"peak_mib": None, "capacity_mib": H100}), False),
        (trial(7, "complete", 16, {"peak_mib": 1.0, "capacity_mib": 0}), False),
        (trial(8, "complete", "16", GOOD), False),
        (trial(9, "complete", 16, "12000"), False),
    ],
)
def test_which_trials_the_model_is_fitted_on(row: Trial, used: bool) -> None:
    points = memory_points([row])
    assert bool(points) == used
    if used:
        assert points == [MemoryPoint(row.number, 16, 12000.0, H100)]
