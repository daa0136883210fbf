"""The diagnosis of jobs whose step timings arrive as real jobs send them (OTLP step and phase
spans through the receiver's mapping), read back through the time-series contract from the
store, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, select

from tests.tuner import jobsim
from tests.tuner.stepspans import write_gauge, write_steps
from tuneloop.job_agents import RankGpus, register_agent
from tuneloop.step_timing import (
    FLOPS_PER_SAMPLE,
    MFU,
    PEAK_FLOPS,
    PHASE_DURATION,
    PHASE_SHARE,
    SAMPLES_PER_SECOND,
    STRAGGLER_RATIO,
    VERDICT,
)
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import Job
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.types import utcnow
from tuner.diagnosis import Diagnosis, Verdict
from tuner.diagnosis_reading import job_diagnosis
from tuner.diagnosis_series import diagnose_job, run_diagnosis, running_jobs

WINDOW = timedelta(seconds=120)
INPUT = {
    "data_loading": 0.4,
    "forward": 0.2,
    "backward": 0.25,
    "grad_sync": 0.05,
    "optimizer": 0.05,
}
COMM = {"data_loading": 0.05, "forward": 0.2, "backward": 0.25, "grad_sync": 0.4, "optimizer": 0.05}
COMPUTE = {
    "data_loading": 0.02,
    "forward": 0.3,
    "backward": 0.5,
    "grad_sync": 0.03,
    "optimizer": 0.05,
}
MIXED = {"data_loading": 0.1, "forward": 0.15, "backward": 0.2, "grad_sync": 0.1, "optimizer": 0.05}


def new_job(engine: Engine, name: str = "train") -> int:
    with session_scope(session_factory(engine)) as session:
        return jobsim.make_job(session, name=name).project_id


def diagnosis(engine: Engine, end: datetime, name: str = "train") -> Diagnosis:
    with session_scope(session_factory(engine)) as session:
        job = session.scalars(select(Job).where(Job.name == name)).one()
        return job_diagnosis(StoreBackend(engine), engine, job, end=end, window=WINDOW)


def share(found: Diagnosis, phase: str) -> float:
    return next(s.share for s in found.shares if s.phase == phase)


def dcgm(index: int, host: str = "node-1", **extra: str) -> dict[str, str]:
    return {"gpu": str(index), "UUID": f"GPU-{host}-{index}", "Hostname": host, **extra}


def test_input_bound(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", INPUT, end=end, noise=0.1)
    found = diagnosis(engine, end)
    assert found.verdict is Verdict.INPUT_BOUND
    assert found.ranks == 2 and not found.excluded and not found.stragglers
    data = next(s for s in found.shares if s.phase == "data_loading")
    assert data.share == pytest.approx(0.4 / 0.95, abs=0.03)
    assert data.low <= data.share <= data.high and data.high - data.low < 0.1
    assert found.step_seconds == pytest.approx(0.95, rel=0.05)
    assert "data_loading" in found.evidence[0]


def test_communication_bound(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", COMM, end=end, ranks=4, noise=0.1)
    found = diagnosis(engine, end)
    assert found.verdict is Verdict.COMMUNICATION_BOUND
    assert share(found, "grad_sync") > 0.3
    assert found.ranks == 4 and not found.stragglers


def test_compute_bound_with_busy_gpus(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", COMPUTE, end=end, noise=0.05)
    for index in range(2):
        labels = dcgm(index, job="train")
        write_gauge(engine, project_id, "DCGM_FI_DEV_GPU_UTIL", labels, 96.0, end=end)
    found = diagnosis(engine, end)
    assert found.verdict is Verdict.COMPUTE_BOUND
    assert found.gpu is not None and found.gpu.utilization == pytest.approx(0.96)
    assert any("GPU utilisation 96%" in line for line in found.evidence)


def test_memory_bound_when_dram_is_busy_and_sms_are_not(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", COMPUTE, end=end)
    labels = dcgm(0, job="train")
    write_gauge(engine, project_id, "DCGM_FI_DEV_GPU_UTIL", labels, 90.0, end=end)
    write_gauge(engine, project_id, "DCGM_FI_PROF_DRAM_ACTIVE", labels, 0.75, end=end)
    write_gauge(engine, project_id, "DCGM_FI_PROF_SM_ACTIVE", labels, 0.3, end=end)
    found = diagnosis(engine, end)
    assert found.verdict is Verdict.MEMORY_BOUND
    assert found.gpu is not None and found.gpu.dram_active == pytest.approx(0.75)


def test_idle_when_the_gpus_wait_and_no_phase_dominates(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", MIXED, end=end, step_over=0.3)
    write_gauge(engine, project_id, "DCGM_FI_DEV_GPU_UTIL", dcgm(0, job="train"), 12.0, end=end)
    found = diagnosis(engine, end)
    assert found.verdict is Verdict.IDLE
    # The same phases with the GPU reported busy enough: no single bound.
    project_b = new_job(engine, "other")
    write_steps(engine, project_b, "other", MIXED, end=end, step_over=0.3)
    assert diagnosis(engine, end, "other").verdict is Verdict.MIXED


def test_a_slowed_rank_is_named_with_its_host_and_gpu(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session)
        project_id = job.project_id
        for host, ranks in (("node-1", (0, 1)), ("node-2", (2, 3))):
            register_agent(
                session,
                job,
                host=host,
                world_size=4,
                ranks=[RankGpus(r, [f"GPU-{host}-{r % 2}"]) for r in ranks],
            )
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", COMPUTE, end=end, ranks=4, slow={2: 1.4}, noise=0.1)
    for host in ("node-1", "node-2"):
        for index in range(2):
            gpu = dcgm(index, host)
            write_gauge(engine, project_id, "DCGM_FI_DEV_GPU_UTIL", gpu, 95.0, end=end)
    found = diagnosis(engine, end)
    assert [s.rank for s in found.stragglers] == ["2"]
    lag = found.stragglers[0]
    assert lag.metric == "backward"  # the longest phase it lags in; its step is lockstep's
    assert lag.host == "node-2" and lag.gpus == ("0",)
    assert lag.seconds == pytest.approx(0.7, rel=0.05)
    assert lag.others_median == pytest.approx(0.5, rel=0.05)
    # The others wait for it in grad_sync: that is not theirs to lag in.
    assert found.verdict is Verdict.COMPUTE_BOUND


def test_noisy_but_equal_ranks_have_no_straggler(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", COMPUTE, end=end, ranks=8, noise=0.4, seed=3)
    found = diagnosis(engine, end)
    assert found.ranks == 8
    assert found.stragglers == ()


def test_a_job_without_step_timings_has_no_data(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0)
    write_gauge(engine, project_id, "DCGM_FI_DEV_GPU_UTIL", dcgm(0, job="train"), 5.0, end=end)
    found = diagnosis(engine, end)
    assert found.verdict is Verdict.NO_DATA
    assert found.shares == () and found.step_seconds is None and found.ranks == 0
    # Timings older than the window are not a diagnosis of now either.
    write_steps(engine, project_id, "train", INPUT, end=end - timedelta(minutes=10))
    assert diagnosis(engine, end).verdict is Verdict.NO_DATA


def test_phases_over_the_step_exclude_the_rank_with_the_reason(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", COMM, end=end, ranks=2)
    # Rank 2's steps end 0.5 s before its phases do: they sum to twice the step.
    write_steps(engine, project_id, "train", INPUT, end=end, ranks=1, first_rank=2, step_over=-0.5)
    found = diagnosis(engine, end)
    assert [e.rank for e in found.excluded] == ["2"]
    assert "phases sum to" in found.excluded[0].reason
    assert found.verdict is Verdict.COMMUNICATION_BOUND  # rank 2's input wait is not counted
    assert found.ranks == 2


def test_negative_times_exclude_the_rank(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", INPUT, end=end, ranks=2)
    # A third-party exporter writing the gauge itself can send what the span mapping cannot.
    labels = {"job": "train", "rank": "1", "phase": "forward"}
    write_gauge(engine, project_id, PHASE_DURATION, labels, -0.2, end=end, seconds=30)
    found = diagnosis(engine, end)
    assert [(e.rank, e.reason) for e in found.excluded] == [
        ("1", "negative step or phase time (-0.2 s)")
    ]
    assert found.verdict is Verdict.INPUT_BOUND and found.ranks == 1
    # Every rank impossible: no data, and why.
    labels = {"job": "train", "rank": "0", "phase": "forward"}
    write_gauge(engine, project_id, PHASE_DURATION, labels, -0.2, end=end, seconds=30)
    found = diagnosis(engine, end)
    assert found.verdict is Verdict.NO_DATA and len(found.excluded) == 2
    assert "excluded" in found.summary


def test_the_periodic_pass_writes_verdict_shares_and_stragglers(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session)
        project_id = job.project_id
        register_agent(
            session, job, host="node-9", world_size=3, ranks=[RankGpus(1, ["GPU-node-9-1"])]
        )
        jobsim.make_job(session, name="waiting", config=None).status = "pending"
    now = utcnow().replace(microsecond=0)
    write_steps(engine, project_id, "train", INPUT, end=now, ranks=3, slow={1: 1.5})
    write_gauge(engine, project_id, "DCGM_FI_DEV_GPU_UTIL", dcgm(1, "node-9"), 90.0, end=now)
    sessions = session_factory(engine)
    assert running_jobs(sessions) == [1]
    run_diagnosis(sessions)
    backend = StoreBackend(engine)
    latest = {
        (s.series.metric, tuple(sorted(s.series.labels.items()))): s.value
        for metric in (PHASE_SHARE, STRAGGLER_RATIO, VERDICT)
        for s in backend.latest(project_id, metric)
    }
    assert latest[(VERDICT, (("job", "train"), ("verdict", "input_bound")))] == 1.0
    data = latest[(PHASE_SHARE, (("job", "train"), ("phase", "data_loading")))]
    assert 0.3 < data < 0.45
    [(key, ratio)] = [(k, v) for k, v in latest.items() if k[0] == STRAGGLER_RATIO]
    assert dict(key[1]) == {
        "job": "train",
        "rank": "1",
        "lags_in": "backward",
        "Hostname": "node-9",
        "gpu": "1",
    }
    assert ratio == pytest.approx(0.5, rel=0.1)  # backward 1.5 times the others'
    # A job gone quiet: only its verdict, no_data.
    later = now + timedelta(minutes=20)
    assert diagnose_job(sessions, 1, now=later) is not None
    verdicts = backend.latest(project_id, VERDICT, since=later)
    assert [s.series.labels["verdict"] for s in verdicts] == ["no_data"]
    assert backend.latest(project_id, PHASE_SHARE, since=later) == []
    assert diagnose_job(sessions, 99) is None


def test_mfu_from_the_job_s_flops_and_samples_and_the_gpu_s_model(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", COMPUTE, end=end, noise=0.05)
    flops = 6 * 1.3e9 * 2048  # a 1.3B-parameter transformer, 2048 tokens per sample
    for index in range(2):
        rank = {"job": "train", "rank": str(index)}
        write_gauge(engine, project_id, FLOPS_PER_SAMPLE, rank, flops, end=end)
        write_gauge(engine, project_id, SAMPLES_PER_SECOND, rank, 10.0 + index, end=end)
        labels = dcgm(index, job="train", modelName="NVIDIA A100-SXM4-80GB")
        write_gauge(engine, project_id, "DCGM_FI_DEV_GPU_UTIL", labels, 97.0, end=end)
        write_gauge(engine, project_id, "DCGM_FI_PROF_SM_ACTIVE", labels, 0.8, end=end)
        write_gauge(engine, project_id, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", labels, 0.45, end=end)
    found = diagnosis(engine, end)
    assert found.verdict is Verdict.COMPUTE_BOUND
    assert found.gpu is not None and found.gpu.tensor_active == pytest.approx(0.45)
    assert found.gpu.sm_active == pytest.approx(0.8)
    assert found.gpu.model_names == ("NVIDIA A100-SXM4-80GB",)
    work = found.efficiency
    assert work is not None and work.excluded is None
    assert work.peak_source == "table: NVIDIA A100-SXM4-80GB"
    assert work.mfu == pytest.approx(flops * 10.5 / 312e12)
    assert any(line.startswith("MFU 54%: 167.7 of 312") for line in found.evidence)
    # The operator's setting overrides the table; the gauge is written with the verdict.
    with session_scope(session_factory(engine)) as session:
        job = session.scalars(select(Job).where(Job.name == "train")).one()
        job_id = job.id
        override = job_diagnosis(
            StoreBackend(engine), engine, job, end=end, window=WINDOW, peak_flops=624e12
        )
    assert override.efficiency is not None
    assert override.efficiency.mfu == pytest.approx(work.mfu / 2)
    diagnose_job(session_factory(engine), job_id, now=end)
    written = StoreBackend(engine).find_series(project_id, MFU, [])
    assert [s.labels for s in written] == [{"job": "train"}]


def test_flops_implying_more_than_the_peak_are_excluded_with_the_reason(engine: Engine) -> None:
    project_id = new_job(engine)
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    write_steps(engine, project_id, "train", COMPUTE, end=end)
    rank = {"job": "train", "rank": "0"}
    write_gauge(engine, project_id, FLOPS_PER_SAMPLE, rank, 1e15, end=end)  # 1 PFLOP a sample
    write_gauge(engine, project_id, SAMPLES_PER_SECOND, rank, 5.0, end=end)
    write_gauge(engine, project_id, PEAK_FLOPS, rank, 989e12, end=end)  # declared by the job
    found = diagnosis(engine, end)
    work = found.efficiency
    assert work is not None and work.mfu is None and work.peak_source == "job"
    assert work.excluded is not None and "over the peak" in work.excluded
    assert not any("MFU" in line for line in found.evidence)
    assert found.verdict is Verdict.COMPUTE_BOUND  # the verdict stands on the timings
