"""The benchmark jobs (``tuneloop.demo.workloads``) build and learn, and the tuning-outcome
benchmark's surface and table code gives the right figures on canned runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from job_runs import place, surface  # noqa: E402
from tuning_outcome_report import ConfigOutcome, table  # noqa: E402

from tuneloop.demo import workloads  # noqa: E402
from tuneloop.demo.workloads.spec import loss, score_sums  # noqa: E402


def test_shapes_relabels_training_labels_only() -> None:
    from tuneloop.demo.workloads import shapes

    y = np.random.default_rng(1).integers(0, shapes.CLASSES, size=30_000)
    held_out = np.arange(5_000)
    labels = shapes.noisy_labels(y, held_out, np.random.default_rng(2))
    assert np.array_equal(labels[held_out], y[held_out])
    changed = float(np.mean(labels[5_000:] != y[5_000:]))
    expected = shapes.LABEL_NOISE * (shapes.CLASSES - 1) / shapes.CLASSES
    assert abs(changed - expected) < 0.02


@pytest.mark.parametrize("name", ["teacher", "shapes", "charlm", "digits"])
def test_workload_data_is_seeded_and_its_model_learns_a_few_steps(
    name: str, tmp_path: Path
) -> None:
    workload = workloads.get(name)
    first, again = tmp_path / "a.npz", tmp_path / "b.npz"
    workload.save_data(first, 0)
    workload.save_data(again, 0)
    data, same = np.load(first), np.load(again)
    for key in ("x_train", "y_train", "x_val", "y_val"):
        assert np.array_equal(data[key], same[key]), key
    assert len(data["y_train"]) > len(data["y_val"]) > 0

    torch.manual_seed(0)
    model = workload.build_model()
    optimizer = workload.make_optimizer(model)
    x, y = torch.from_numpy(data["x_train"][:64]), torch.from_numpy(data["y_train"][:64])
    losses = []
    for _ in range(8):
        step_loss = loss(model(x), y)
        optimizer.zero_grad()
        torch.autograd.backward(step_loss)
        optimizer.step()
        losses.append(float(step_loss.detach()))
    assert losses[-1] < losses[0]
    total, count = score_sums(
        workload, model, torch.from_numpy(data["x_val"]), torch.from_numpy(data["y_val"])
    )
    value = total / count
    assert math.isfinite(value)
    if workload.metric == "accuracy":
        assert 0.0 <= value <= 1.0
    else:
        assert 0.0 < value < 8.0  # bits per ASCII character


def test_an_unknown_workload_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown workload 'mnist': choose one of digits, "):
        workloads.get("mnist")


def test_reaching_the_target_follows_the_metric_direction() -> None:
    assert workloads.get("shapes").reached(0.95) and not workloads.get("shapes").reached(0.5)
    charlm = workloads.get("charlm")
    assert charlm.reached(charlm.target - 0.1) and not charlm.reached(charlm.target + 0.1)


def _run(batch: int, period: int, ttt: float | None, budget: float = 30.0) -> dict[str, Any]:
    return {
        "batch_size": batch,
        "sync_period": period,
        "time_to_target_s": ttt,
        "time_budget_s": budget,
        "loadavg_1m_before": 1.0,
        "loadavg_1m_after": 3.0,
    }


def test_surface_ranks_configs_by_mean_time_counting_a_miss_at_the_budget() -> None:
    runs = [
        *(_run(32, 1, t) for t in (10.0, 12.0, 14.0)),
        *(_run(128, 2, t) for t in (5.0, 6.0, 7.0)),
        *(_run(8, 1, t) for t in (20.0, None, 22.0)),
    ]
    points = surface(runs)
    assert [p.config for p in points] == [
        {"batch_size": 128, "sync_period": 2},
        {"batch_size": 32, "sync_period": 1},
        {"batch_size": 8, "sync_period": 1},
    ]
    assert points[2].time_to_target.mean == pytest.approx(24.0)
    assert points[2].reached == 2
    assert points[2].speed == pytest.approx((1 / 20 + 1 / 22) / 3)
    assert points[0].loadavg_1m == pytest.approx(2.0)
    # the 95% t half-width of 5, 6, 7 (2 degrees of freedom, standard deviation 1)
    assert points[0].time_to_target.half_width == pytest.approx(4.302653 / math.sqrt(3))

    placed = place(points, 8.0)
    assert (placed.rank, placed.of) == (2, 3)
    assert placed.speed_fraction == pytest.approx(6.0 / 8.0)
    assert placed.best == {"batch_size": 128, "sync_period": 2}


def test_table_gives_speedups_with_welch_intervals() -> None:
    start = ConfigOutcome.of(
        "start", {"batch_size": 4, "sync_period": 1}, [_run(4, 1, t) for t in (30.0, None)]
    )
    default = ConfigOutcome.of(
        "default",
        {"batch_size": 32, "sync_period": 1},
        [_run(32, 1, t) for t in (10.0, 12.0, 11.0)],
    )
    tuned = ConfigOutcome.of(
        "tuned", {"batch_size": 128, "sync_period": 2}, [_run(128, 2, t) for t in (5.0, 6.0, 7.0)]
    )
    placement = place(surface([_run(128, 2, 5.5), _run(128, 2, 6.5), _run(32, 1, 11.0)]), 6.0)
    lines, speedups = table(
        [start, default, tuned],
        "92.0% accuracy",
        placement,
        {"min": 1.0, "max": 3.5, "burners": 2.0},
    )
    versus = {s.versus: s for s in speedups}
    assert versus["default"].ratio == pytest.approx(11.0 / 6.0)
    assert versus["default"].difference_s == pytest.approx(5.0)
    assert versus["default"].significant
    assert versus["start"].ratio == pytest.approx(5.0)
    text = "\n".join(lines)
    assert "tuned vs default: 1.83x faster, beyond the noise" in text
    assert "1 run(s) missed the target, counted at the budget" in lines[5]
    assert "   start         4 x 1" in text and "1/2" in text
    assert "tuned ranks 1 of 2, at 100% of the best config's speed (128 x 2)" in text
    assert "2 CPU burner(s)" in text
