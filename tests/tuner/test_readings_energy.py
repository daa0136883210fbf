"""The mean power of a job's GPUs over a window, from their energy counters in the store
(SQLite and PostgreSQL): the job's GPUs by label or registered UUID, counter resets, and MIG
instances sharing their GPU's counter as in cost accounting."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine

from tests.tuner import jobsim
from tuneloop.cost import ENERGY_METRIC
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow
from tuner.readings import gpu_power


def counter(
    engine: Engine, project_id: int, labels: dict[str, str], start: datetime, values: list[float]
) -> None:
    """One energy sample (mJ) every 10 s from ``start``, as a 10 s collector interval writes."""
    times = [start + timedelta(seconds=10 * i) for i in range(len(values))]
    batch = SeriesBatch(ENERGY_METRIC, labels, times, values, SeriesKind.COUNTER)
    assert not SampleWriter(engine).write(project_id, [batch]).rejected


def test_power_of_the_jobs_gpus_from_their_counters(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        project_id = jobsim.make_job(session).project_id
    t0 = utcnow() - timedelta(minutes=10)
    host = {"Hostname": "node-1"}
    # 300 W: 3,000,000 mJ per 10 s, labelled with the job.
    counter(
        engine,
        project_id,
        {**host, "gpu": "0", "UUID": "GPU-a", "job": "train"},
        t0,
        [1e9 + 3e6 * i for i in range(7)],
    )
    # Registered by UUID; reset after the third sample, 200 W throughout.
    counter(
        engine,
        project_id,
        {**host, "gpu": "1", "UUID": "GPU-b"},
        t0,
        [5e8, 5e8 + 2e6, 5e8 + 4e6, 2e6, 4e6, 6e6, 8e6],
    )
    # Two MIG instances of one GPU report its whole counter (400 W): each gets half.
    for instance in ("1", "2"):
        labels = {
            **host,
            "gpu": "2",
            "UUID": "GPU-c",
            "GPU_I_PROFILE": "3g.40gb",
            "GPU_I_ID": instance,
            "job": "train",
        }
        counter(engine, project_id, labels, t0, [4e6 * i for i in range(7)])
    # Another job's GPU on the same host.
    counter(
        engine,
        project_id,
        {**host, "gpu": "3", "UUID": "GPU-d", "job": "other"},
        t0,
        [9e6 * i for i in range(7)],
    )
    power = gpu_power(
        StoreBackend(engine),
        project_id,
        "train",
        ("GPU-b",),
        start=t0,
        end=t0 + timedelta(seconds=60),
    )
    assert power is not None
    # (t0, t0 + 60 s]: six samples each, 50 s apart.
    assert power.watts == pytest.approx(300 + 200 + 200 + 200)
    assert power.joules == pytest.approx(900 * 60)
    assert sorted((g["UUID"], g.get("GPU_I_ID", "")) for g in power.gpus) == [
        ("GPU-a", ""),
        ("GPU-b", ""),
        ("GPU-c", "1"),
        ("GPU-c", "2"),
    ]
    assert {g["seconds"] for g in power.gpus} == {50.0}


def test_no_power_without_two_samples_in_the_window(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        project_id = jobsim.make_job(session).project_id
    t0 = utcnow() - timedelta(minutes=10)
    counter(engine, project_id, {"UUID": "GPU-a", "job": "train"}, t0, [1e9, 1e9 + 3e6])
    series = StoreBackend(engine)
    assert gpu_power(series, project_id, "train", start=t0, end=t0 + timedelta(seconds=10)) is None
    assert gpu_power(series, project_id, "nobody", start=t0, end=t0 + timedelta(seconds=60)) is None
