"""Which GPUs are a job's, and their framebuffer over a window, read from the store (SQLite and
PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from tests.tuner import jobsim
from tuneloop.job_agents import RankGpus, register_agent
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.types import utcnow
from tuner.readings import gpu_memory, job_gpu_uuids, registered_gpu_uuids

TOTAL = 81559.0


def gpu(index: int, host: str = "node-1", **extra: str) -> dict[str, str]:
    return {
        "gpu": str(index),
        "UUID": f"GPU-{host}-{index}",
        "device": f"nvidia{index}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": host,
        **extra,
    }


def test_the_jobs_gpus_by_label_or_registered_uuid(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session, labels={"gpu_uuids": "GPU-node-2-0, GPU-node-2-1"})
        project_id = job.project_id
        uuids = job_gpu_uuids(job.labels)
    assert uuids == ("GPU-node-2-0", "GPU-node-2-1")
    t0 = utcnow() - timedelta(minutes=10)
    window = {"start": t0, "end": t0 + timedelta(seconds=60)}
    # GPU 0 of node-1 carries the job's label (relabel rules, the exporter's pod mapping)...
    jobsim.write_gpu_memory(
        engine, project_id, gpu(0, job="train"), **window, used_mib=30000, total_mib=TOTAL
    )
    # ...node-2's GPUs are the job's by the UUIDs its agent registered; one also has the label.
    jobsim.write_gpu_memory(
        engine, project_id, gpu(0, "node-2"), **window, used_mib=41000, total_mib=TOTAL
    )
    jobsim.write_gpu_memory(
        engine, project_id, gpu(1, "node-2", job="train"), **window, used_mib=40000, total_mib=40960
    )
    # Another job's GPU, and one of nobody's, are not this job's.
    jobsim.write_gpu_memory(
        engine, project_id, gpu(1, job="other"), **window, used_mib=79000, total_mib=TOTAL
    )
    jobsim.write_gpu_memory(engine, project_id, gpu(2), **window, used_mib=79000, total_mib=TOTAL)

    reading = gpu_memory(StoreBackend(engine), project_id, "train", uuids, **window)
    assert reading is not None
    assert sorted((g["Hostname"], g["gpu"]) for g in reading.gpus) == [
        ("node-1", "0"),
        ("node-2", "0"),
        ("node-2", "1"),
    ]
    assert reading.peak_mib == pytest.approx(41000)
    assert reading.capacity_mib == pytest.approx(40960)  # the smallest device
    as_json = reading.to_dict()
    assert as_json["peak_mib"] == reading.peak_mib and len(as_json["gpus"]) == 3

    only_label = gpu_memory(StoreBackend(engine), project_id, "train", (), **window)
    assert only_label is not None and only_label.peak_mib == pytest.approx(40000)
    # Outside the window, or a job without GPU series: no reading, never a zero.
    later = {"start": t0 + timedelta(seconds=120), "end": t0 + timedelta(seconds=180)}
    assert gpu_memory(StoreBackend(engine), project_id, "train", uuids, **later) is None
    assert gpu_memory(StoreBackend(engine), project_id, "nobody", (), **window) is None


@pytest.mark.parametrize(
    ("labels", "uuids"),
    [
        ({}, ()),
        ({"gpu_uuids": ""}, ()),
        ({"gpu_uuids": "GPU-a,,GPU-b,GPU-a"}, ("GPU-a", "GPU-b")),
        (None, ()),
    ],
)
def test_registered_uuids(labels: dict[str, str] | None, uuids: tuple[str, ...]) -> None:
    assert job_gpu_uuids(labels) == uuids


def test_gpus_registered_by_the_jobs_agent_are_the_jobs(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session, labels={"gpu_uuids": "GPU-node-2-0"})
        register_agent(
            session,
            job,
            host="node-3",
            world_size=2,
            ranks=[RankGpus(0, ["GPU-node-3-0"]), RankGpus(1, ["GPU-node-3-1", "GPU-node-2-0"])],
        )
        session.flush()
        job_id, labels = job.id, dict(job.labels)

    registered = registered_gpu_uuids(engine, job_id)
    assert registered == ("GPU-node-3-0", "GPU-node-3-1", "GPU-node-2-0")
    # The label's first, then the registered ones; each once.
    assert job_gpu_uuids(labels, registered) == ("GPU-node-2-0", "GPU-node-3-0", "GPU-node-3-1")
