"""Cost of MIG instances and by namespace and pod: an instance is its graphics-engine activity
series (it has no DCGM_FI_DEV_GPU_UTIL) and gets an equal share of its GPU's energy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from tests.storage.test_query import make_project
from tuneloop import cost
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
STAMPS = [T0 + timedelta(seconds=s) for s in range(0, 600, 30)]
WHOLE = {"gpu": "0", "UUID": "GPU-W", "Hostname": "n1", "pod": "train-0", "namespace": "ml"}
MIG = {"gpu": "3", "UUID": "GPU-M", "Hostname": "n1"}
BUSY = {**MIG, "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "1", "pod": "embed", "namespace": "inf"}
IDLE = {**MIG, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "9"}


def series(metric: str, labels: dict[str, str], value: float, per_s: float = 0.0) -> SeriesBatch:
    kind = SeriesKind.COUNTER if per_s else SeriesKind.GAUGE
    values = [value + per_s * (ts - T0).total_seconds() for ts in STAMPS]
    return SeriesBatch(metric, labels, STAMPS, values, kind)


def test_mig_instances_namespaces_and_pods(engine: Engine) -> None:
    project = make_project(engine)
    energy = cost.ENERGY_METRIC
    batches = [
        series(cost.UTILIZATION_METRIC, WHOLE, 90.0),
        series(cost.ACTIVITY_METRIC, WHOLE, 0.9),  # the same GPU: counted once, by its util
        series(energy, WHOLE, 0.0, per_s=2000.0),
        series(cost.ACTIVITY_METRIC, BUSY, 0.5),
        series(cost.ACTIVITY_METRIC, IDLE, 0.01),
        # Each instance reports its GPU's counter: 1000 mJ/s for the two together.
        series(energy, BUSY, 0.0, per_s=1000.0),
        series(energy, IDLE, 0.0, per_s=1000.0),
    ]
    assert not SampleWriter(engine).write(project, batches).rejected

    usages = cost.gpu_usage(engine, project, T0, T0 + timedelta(minutes=10))

    by_gpu = {g.key: g for g in cost.summarize(usages, cost.GroupBy.GPU)}
    assert set(by_gpu) == {"n1/0/GPU-W", "n1/3/GPU-M/3g.40gb/1", "n1/3/GPU-M/1g.10gb/9"}
    # 570 s of samples: 1140 J for the whole GPU, the MIG GPU's 570 J shared by two instances.
    figures = {k: (g.gpu_seconds, g.idle_gpu_seconds, g.energy_joules) for k, g in by_gpu.items()}
    assert figures == {
        "n1/0/GPU-W": (600.0, 0.0, pytest.approx(1140.0)),
        "n1/3/GPU-M/3g.40gb/1": (600.0, 0.0, pytest.approx(285.0)),
        "n1/3/GPU-M/1g.10gb/9": (600.0, 600.0, pytest.approx(285.0)),
    }
    namespaces = {g.key: g.gpu_seconds for g in cost.summarize(usages, cost.GroupBy.NAMESPACE)}
    assert namespaces == {"ml": 600.0, "inf": 600.0, None: 600.0}
    pods = {g.key: g.idle_gpu_seconds for g in cost.summarize(usages, cost.GroupBy.POD)}
    assert pods == {"train-0": 0.0, "embed": 0.0, None: 600.0}
    assert cost.total(usages).energy_joules == pytest.approx(1710.0)
