"""Migration 0011 replaces the Cost dashboard's ``tuneloop_gpu_usage`` with one that counts MIG
instances (their ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` series, an equal share of their GPU's energy)
and names each GPU's namespace and pod, giving the API's figures (``tuneloop.cost``); and back.
A fleet with a whole GPU and a MIG GPU of two instances is written at revision 0010, on real
PostgreSQL; on SQLite, which has no stored functions, the migration changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text

from tests.storage.test_writer import make_project
from tuneloop import cost
from tuneloop.storage import make_engine, migrate
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

BOTH = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]
T0 = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)
END = T0 + timedelta(minutes=10)
HOST = {"Hostname": "gpu-node-42", "modelName": "NVIDIA A100-SXM4-80GB"}
WHOLE = {**HOST, "gpu": "0", "UUID": "GPU-aaaa", "namespace": "ml", "pod": "train-0"}
MIG = {**HOST, "gpu": "3", "UUID": "GPU-bbbb"}
INSTANCES = [
    {**MIG, "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "1", "namespace": "inference", "pod": "embed"},
    {**MIG, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "9"},
]


def fleet(engine: Engine) -> int:
    """The fleet, sampled every 30 s for ten minutes: the whole GPU busy, the first instance
    idle (1% active), the second busy; each GPU's energy counter 600 J a minute."""
    project = make_project(engine)
    stamps = [T0 + timedelta(seconds=30 * k) for k in range(21)]
    energy = [600_000.0 * k / 2 for k in range(21)]  # millijoules

    def series(metric: str, labels: dict[str, str], values: list[float]) -> SeriesBatch:
        kind = SeriesKind.COUNTER if metric == cost.ENERGY_METRIC else SeriesKind.GAUGE
        return SeriesBatch(metric, labels, stamps, values, kind)

    batches = [
        series(cost.UTILIZATION_METRIC, WHOLE, [90.0] * 21),
        series(cost.ACTIVITY_METRIC, WHOLE, [0.9] * 21),
        series(cost.ENERGY_METRIC, WHOLE, energy),
        series(cost.ACTIVITY_METRIC, INSTANCES[0], [0.01] * 21),
        series(cost.ACTIVITY_METRIC, INSTANCES[1], [0.7] * 21),
        *(series(cost.ENERGY_METRIC, labels, energy) for labels in INSTANCES),
    ]
    result = SampleWriter(engine).write(project, batches)
    assert not result.rejected
    return project


def board(engine: Engine) -> dict[str, dict[str, Any]]:
    """gpu key -> the row the Cost dashboard's function gives for it."""
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT * FROM tuneloop_gpu_usage('p', :start, :end, 5.0)"),
            {"start": T0, "end": END},
        ).mappings()
        return {cost.gpu_key(row["labels"]): dict(row) for row in rows}


def api(engine: Engine, project: int) -> dict[str, dict[str, Any]]:
    return {
        cost.gpu_key(usage.labels): {
            "labels": dict(usage.labels),
            "job": usage.job or "",
            "team": usage.team or "",
            "namespace": usage.labels.get("namespace", ""),
            "pod": usage.labels.get("pod", ""),
            "gpu_seconds": usage.gpu_seconds,
            "idle_gpu_seconds": usage.idle_gpu_seconds,
            "energy_joules": usage.energy_joules,
        }
        for usage in cost.gpu_usage(engine, project, T0, END)
    }


def function_columns(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                text("SELECT * FROM tuneloop_gpu_usage('none', now(), now())")
            ).keys()
        )


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_upgrade_counts_mig_instances_with_the_apis_figures(empty_database_url: str) -> None:
    url = empty_database_url
    migrate.upgrade(url, "0010")
    engine = make_engine(url)
    try:
        project = fleet(engine)
        expected = api(engine, project)
        assert sorted(expected) == [
            "gpu-node-42/0/GPU-aaaa",
            "gpu-node-42/3/GPU-bbbb/1g.10gb/9",
            "gpu-node-42/3/GPU-bbbb/3g.40gb/1",
        ]
        first = expected["gpu-node-42/3/GPU-bbbb/3g.40gb/1"]
        assert (first["gpu_seconds"], first["idle_gpu_seconds"]) == (600.0, 600.0)
        # 19 increments of 300 J in [T0, END) (the first sample has none before it), halved.
        assert first["energy_joules"] == pytest.approx(19 * 300.0 / 2)
        if engine.dialect.name == "postgresql":
            before = board(engine)
            assert list(before) == ["gpu-node-42/0/GPU-aaaa"], "0005 counts whole GPUs only"

        migrate.upgrade(url, "0011")

        if engine.dialect.name == "postgresql":
            assert board(engine) == expected
            assert "namespace" in function_columns(engine)
        else:
            assert "samples" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_downgrade_restores_the_whole_gpu_function(empty_database_url: str) -> None:
    url = empty_database_url
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        fleet(engine)

        migrate.downgrade(url, "0010")

        assert migrate.current(url) == "0010"
        if engine.dialect.name == "postgresql":
            assert list(board(engine)) == ["gpu-node-42/0/GPU-aaaa"]
            assert "namespace" not in function_columns(engine)
        migrate.upgrade(url)
        if engine.dialect.name == "postgresql":
            assert len(board(engine)) == 3
    finally:
        engine.dispose()
