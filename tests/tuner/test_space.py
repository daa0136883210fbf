"""Search spaces: validation, the lattice, the learning-rate rule, serialisation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tuner.space import (
    CategoricalParam,
    IntParam,
    SearchSpace,
    SpaceError,
    max_batch_for_memory,
)


def training(**kw: object) -> SearchSpace:
    args: dict[str, object] = {
        "batch_size": (16, 1024),
        "sync_period": (1, 8),
        "lr_scaling": "linear",
        "base_lr": 0.1,
        "base_batch": 256,
    }
    args.update(kw)
    return SearchSpace.training(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: IntParam("b", 64, 32), "inverted bounds, low 64 > high 32"),
        (lambda: IntParam("b", 33, 63, powers_of_two=True), "contain no power of two"),
        (lambda: IntParam("b", 0, 8, log=True), "log scale needs low >= 1"),
        (lambda: IntParam("b", 0, 8, powers_of_two=True), "powers of two needs low >= 1"),
        (lambda: IntParam("b", 1.5, 8), "low must be an integer"),  # type: ignore[arg-type]
        (lambda: IntParam("b", True, 8), "low must be an integer"),
        (lambda: IntParam("", 1, 8), "non-empty string"),
        (lambda: CategoricalParam("c", ()), "empty choices"),
        (lambda: CategoricalParam("c", ("a", "a")), "duplicate choices"),
        (lambda: CategoricalParam("c", (float("nan"),)), "not a JSON scalar"),
        (lambda: SearchSpace(()), "at least one parameter"),
        (lambda: SearchSpace((IntParam("a", 1, 2), IntParam("a", 1, 3))), "duplicate parameter"),
        (lambda: SearchSpace((IntParam("a", 1, 2),), lr_scaling="cubic"), "unknown lr_scaling"),  # type: ignore[arg-type]
        (lambda: SearchSpace((IntParam("a", 1, 2),), sync_mode="async"), "unknown sync_mode"),  # type: ignore[arg-type]
        (lambda: training(base_lr=None), "needs base_lr and base_batch"),
        (lambda: training(base_lr=-1.0), "base_lr must be a positive number"),
        (lambda: training(base_batch=0), "base_batch must be a positive integer"),
        (
            lambda: SearchSpace((IntParam("a", 1, 2),), "linear", 0.1, 256),
            "needs a 'batch_size' parameter",
        ),
        (lambda: training(batch_size=()), "batch_size: empty bounds"),
        (lambda: training(batch_size=(512, 64)), "batch_size: inverted bounds"),
        (lambda: training(sync_period=(8,)), "sync_period: empty bounds"),
        (lambda: training(batch_size=(33, 63)), "batch_size: bounds [33, 63] contain no power"),
    ],
)
def test_invalid_spaces_are_refused_with_one_clear_message(build, message) -> None:
    with pytest.raises(SpaceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build()


@pytest.mark.parametrize(
    ("param", "values"),
    [
        (IntParam("b", 16, 128, powers_of_two=True), (16, 32, 64, 128)),
        (IntParam("b", 24, 200, powers_of_two=True), (32, 64, 128)),
        (IntParam("k", 1, 4), (1, 2, 3, 4)),
        (IntParam("k", 5, 5), (5,)),
        (IntParam("m", 1, 256, log=True), (1, 2, 5, 11, 24, 53, 116, 256)),
        (IntParam("m", 0, 70), (0, 10, 20, 30, 40, 50, 60, 70)),
    ],
)
def test_lattice_values(param: IntParam, values: tuple[int, ...]) -> None:
    assert param.values(8) == values
    assert all(type(v) is int for v in param.values(8))


@pytest.mark.parametrize(
    ("config", "ok"),
    [
        ({"batch_size": 64, "sync_period": 2}, True),
        ({"batch_size": np.int64(64), "sync_period": 2}, True),
        ({"batch_size": 48, "sync_period": 2}, False),  # not a power of two
        ({"batch_size": 2048, "sync_period": 2}, False),
        ({"batch_size": 64, "sync_period": 0}, False),
        ({"batch_size": 64.0, "sync_period": 2}, False),
        ({"batch_size": True, "sync_period": 2}, False),
        ({"batch_size": 64}, False),
        ({"batch_size": 64, "sync_period": 2, "extra": 1}, False),
    ],
)
def test_contains(config: dict[str, object], ok: bool) -> None:
    assert training().contains(config) is ok


def test_validate_names_the_problem_and_returns_plain_ints() -> None:
    space = training()
    with pytest.raises(
        SpaceError, match=r"batch_size=48 is outside \[16, 1024\] \(powers of two\)"
    ):
        space.validate({"batch_size": 48, "sync_period": 1})
    with pytest.raises(SpaceError, match="missing parameter 'sync_period'"):
        space.validate({"batch_size": 64})
    config = space.validate({"batch_size": np.int64(64), "sync_period": np.int32(2)})
    assert config == {"batch_size": 64, "sync_period": 2}
    assert all(type(v) is int for v in config.values())


def test_grid_order_is_deterministic_first_parameter_slowest() -> None:
    space = SearchSpace(
        (IntParam("a", 1, 4, powers_of_two=True), CategoricalParam("c", ("x", "y")))
    )
    assert space.grid() == [
        {"a": 1, "c": "x"},
        {"a": 1, "c": "y"},
        {"a": 2, "c": "x"},
        {"a": 2, "c": "y"},
        {"a": 4, "c": "x"},
        {"a": 4, "c": "y"},
    ]
    assert space.grid_size() == 6


def test_oversized_grid_is_refused() -> None:
    space = SearchSpace((IntParam("a", 1, 1000), IntParam("b", 1, 1000)))
    with pytest.raises(SpaceError, match="exceeds"):
        space.grid(resolution=None)
    assert len(space.grid(resolution=10)) == 100


def test_neighbours_step_one_lattice_point_in_one_parameter() -> None:
    space = SearchSpace(
        (
            IntParam("batch_size", 16, 128, powers_of_two=True),
            IntParam("sync_period", 1, 4),
            CategoricalParam("algo", ("ring", "tree")),
        )
    )
    assert space.neighbours({"batch_size": 16, "sync_period": 2, "algo": "ring"}) == [
        {"batch_size": 32, "sync_period": 2, "algo": "ring"},
        {"batch_size": 16, "sync_period": 1, "algo": "ring"},
        {"batch_size": 16, "sync_period": 3, "algo": "ring"},
        {"batch_size": 16, "sync_period": 2, "algo": "tree"},
    ]


def test_lattice_coordinates_are_in_steps() -> None:
    space = SearchSpace(
        (IntParam("b", 16, 128, powers_of_two=True), CategoricalParam("c", ("x", "y")))
    )
    coords = space.lattice_coordinates([{"b": 16, "c": "x"}, {"b": 32, "c": "y"}])
    assert coords[0, 0] == pytest.approx(0.0)
    assert coords[1, 0] == pytest.approx(1.0)  # one power of two = one step
    assert np.linalg.norm(coords[0, 1:] - coords[1, 1:]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("rule", "mode", "config", "ranks", "expected"),
    [
        # B = 32 * 8 * 1 = 256 = B0: the base learning rate.
        ("linear", "accumulate", {"batch_size": 32, "sync_period": 1}, 8, 0.1),
        # B = 64 * 8 * 2 = 1024 = 4 B0.
        ("linear", "accumulate", {"batch_size": 64, "sync_period": 2}, 8, 0.4),
        ("sqrt", "accumulate", {"batch_size": 64, "sync_period": 2}, 8, 0.2),
        # Local SGD: the period does not enter the lr batch, B = 64 * 8 = 512.
        ("linear", "local_sgd", {"batch_size": 64, "sync_period": 2}, 8, 0.2),
        ("sqrt", "local_sgd", {"batch_size": 64, "sync_period": 2}, 8, 0.1 * math.sqrt(2)),
        # Smaller than B0 scales down.
        ("linear", "accumulate", {"batch_size": 16, "sync_period": 1}, 4, 0.025),
    ],
)
def test_lr_rule(rule, mode, config, ranks, expected) -> None:
    space = training(lr_scaling=rule, sync_mode=mode)
    assert space.apply_lr_rule(config, ranks=ranks) == pytest.approx(expected)


def test_lr_rule_overrides_and_absence() -> None:
    space = training()
    config = {"batch_size": 64, "sync_period": 2}
    assert space.apply_lr_rule(config, ranks=8, base_lr=1.0, base_batch=512) == pytest.approx(2.0)
    assert training(lr_scaling=None).apply_lr_rule(config, ranks=8) is None
    with pytest.raises(SpaceError, match="ranks must be a positive integer"):
        space.apply_lr_rule(config, ranks=0)


def test_effective_batch_counts_sync_period_in_both_modes() -> None:
    config = {"batch_size": 64, "sync_period": 4}
    for mode in ("accumulate", "local_sgd"):
        assert training(sync_mode=mode).effective_batch(config, ranks=8) == 64 * 8 * 4
    assert (
        SearchSpace.training((16, 64), lr_scaling=None).effective_batch({"batch_size": 32}, ranks=2)
        == 64
    )


def test_desired_config_carries_the_learning_rate() -> None:
    desired = training().desired({"batch_size": 64, "sync_period": 2}, ranks=8)
    assert desired == {"batch_size": 64, "sync_period": 2, "learning_rate": pytest.approx(0.4)}


def test_round_trip_through_json() -> None:
    space = SearchSpace.training(
        (16, 1024),
        (1, 8),
        (1, 256),
        lr_scaling="sqrt",
        base_lr=3e-4,
        base_batch=512,
        sync_mode="local_sgd",
        extra=(CategoricalParam("algo", ("ring", "tree", 1, True)),),
    )
    data = json.loads(json.dumps(space.to_dict()))
    assert SearchSpace.from_dict(data) == space
    assert SearchSpace.from_dict(data).to_dict() == space.to_dict()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be an object"),
        ({"params": "x"}, "needs a 'params' list"),
        ({"version": 2, "params": []}, "unsupported search space version"),
        ({"params": [{"type": "float", "name": "x"}]}, "unknown type 'float'"),
        ({"params": [{"type": "int", "name": "x", "low": 1}]}, "missing field 'high'"),
        ({"params": [{"type": "int", "name": "x", "low": 9, "high": 1}]}, "inverted bounds"),
        ({"params": []}, "at least one parameter"),
    ],
)
def test_from_dict_refuses_bad_input(data, message) -> None:
    with pytest.raises(SpaceError, match=message):
        SearchSpace.from_dict(data)


def test_memory_headroom_bounds_the_space() -> None:
    # 80 GB device, 10% headroom, 20 GB fixed, 100 MB per sample: (72 - 20) GB / 0.1 GB = 520.
    high = max_batch_for_memory(80e9, 20e9, 100e6, headroom=0.1)
    assert high == 520
    limited = training().limit("batch_size", high)
    assert limited["batch_size"].values() == (16, 32, 64, 128, 256, 512)
    with pytest.raises(SpaceError, match="limit 8 is below the lower bound 16"):
        training().limit("batch_size", 8)
    with pytest.raises(SpaceError, match="contain no power of two"):
        training(batch_size=(17, 1024)).limit("batch_size", 31)
    with pytest.raises(SpaceError, match="no batch fits"):
        max_batch_for_memory(80e9, 79e9, 1e9)


def test_samples_and_unit_points_stay_in_the_space() -> None:
    space = SearchSpace.training(
        (8, 1000), (1, 16), (1, 256), batch_powers_of_two=False, lr_scaling=None
    )
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert space.contains(space.sample(rng))
    for point in ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.999, 0.3]):
        assert space.contains(space.from_unit(point))
    assert space.from_unit([0.0, 0.0, 0.0]) == {"batch_size": 8, "sync_period": 1, "bucket_mb": 1}
    assert space.from_unit([1.0, 1.0, 1.0]) == {
        "batch_size": 1000,
        "sync_period": 16,
        "bucket_mb": 256,
    }
