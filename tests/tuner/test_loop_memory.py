"""The memory bound through the tuning loop (SQLite and PostgreSQL): the job's GPUs report their
framebuffer to the store as the collectors do, the loop records it with each trial, and once two
batch sizes are measured the loop stops proposing batch sizes that would not leave the headroom
free, saying so in the audit log."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select

from tests.tuner import jobsim
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import AuditEntry, Study, Trial
from tuneloop.storage.types import utcnow
from tuner import service
from tuner.loop import reconcile_study
from tuner.measurement import MeasurementPolicy
from tuner.space import SearchSpace
from tuner.strategies.base import SpaceExhausted
from tuner.study_options import MemoryPolicy, StudyOptions

SPACE = SearchSpace.training((8, 512), (1, 2), sync_powers_of_two=True, lr_scaling=None)
POLICY = MeasurementPolicy(
    warmup_s=10, window_s=20, min_samples=8, max_rel_stderr=0.02, max_age_s=30, max_extensions=2
)
TOTAL_MIB = 81559.0
FIXED_MIB, PER_SAMPLE_MIB = 30000.0, 350.0
# 10% headroom: (81559 * 0.9 - 30000) / 350 = 124.0 -> batch 128 (74800 MiB, 8% free) and
# larger are excluded; 256 and 512 do not fit at all and run out of memory.
BOUND = 124
RANKS = 2


def peak_mib(batch: int) -> float:
    return FIXED_MIB + PER_SAMPLE_MIB * batch


@dataclass
class SimulatedJob:
    """Two ranks, each on its own GPU: GPU 0 carries the job's label, GPU 1 is the job's by the
    UUID its agent registered. A batch that does not fit is reported out of memory."""

    engine: Engine
    study_id: int
    job_id: int
    project_id: int
    t0: datetime = field(default_factory=lambda: utcnow() - timedelta(hours=1))

    def at(self, seconds: float) -> datetime:
        return self.t0 + timedelta(seconds=seconds)

    def step(self, seconds: float) -> Any:
        with session_scope(session_factory(self.engine)) as session:
            return reconcile_study(session, self.study_id, now=self.at(seconds))

    def trial(self, number: int) -> Trial:
        with session_scope(session_factory(self.engine)) as session:
            row = session.scalars(
                select(Trial).where(Trial.study_id == self.study_id, Trial.number == number)
            ).one()
            session.expunge(row)
            return row

    def run_trial(self, base: float) -> str:
        """One pass that asks, then the job's side and the passes until the trial is told."""
        result = self.step(base)
        if result.action == "completed":
            return "completed"
        assert result.action == "asked", result
        trial = self.trial(result.trial)
        batch = trial.params["batch_size"]
        version = trial.desired_version
        assert version is not None
        if peak_mib(batch) > TOTAL_MIB:
            jobsim.report(self.engine, self.job_id, version, at=self.at(base + 1), status="oom")
            told = self.step(base + 2)
            assert told.detail == "infeasible: oom", told
            return "oom"
        jobsim.report(self.engine, self.job_id, version, at=self.at(base + 1))
        assert self.step(base + 2).action == "applied"
        start, end = self.at(base + 1), self.at(base + 32)
        per_rank = 10.0 * batch * (1 + 0.2 * trial.params["sync_period"])
        jobsim.write_steps(
            self.engine, self.project_id, "train", start=start, end=end, per_rank=per_rank
        )
        for index, extra in enumerate(({"job": "train"}, {})):
            jobsim.write_gpu_memory(
                self.engine,
                self.project_id,
                {"gpu": str(index), "UUID": f"GPU-{index}", "Hostname": "node-1", **extra},
                start=start,
                end=end,
                used_mib=peak_mib(batch) - 500 * index,
                total_mib=TOTAL_MIB,
            )
        told = self.step(base + 32)
        assert told.detail == "complete", told
        return "complete"

    def run(self, trials: int) -> str:
        outcome = ""
        for i in range(trials):
            outcome = self.run_trial(100.0 * i)
            if outcome == "completed":
                break
        return outcome

    def trials(self) -> list[Trial]:
        with session_scope(session_factory(self.engine)) as session:
            rows = session.scalars(
                select(Trial).where(Trial.study_id == self.study_id).order_by(Trial.number)
            ).all()
            session.expunge_all()
            return list(rows)

    def audit(self, action: str) -> list[AuditEntry]:
        with session_scope(session_factory(self.engine)) as session:
            rows = session.scalars(
                select(AuditEntry).where(AuditEntry.action == action).order_by(AuditEntry.id)
            ).all()
            session.expunge_all()
            return list(rows)


def simulated(engine: Engine, strategy: str, memory: MemoryPolicy) -> SimulatedJob:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session, labels={"gpu_uuids": "GPU-1"})
        study = service.create_study(
            session,
            job,
            name="s",
            objective="throughput",
            space=SPACE,
            strategy=strategy,
            seed=5,
            options=StudyOptions(measurement=POLICY, ranks=RANKS, memory=memory),
        )
        return SimulatedJob(engine, study.id, job.id, job.project_id)


def measured_batches(trials: list[Trial], before: int) -> set[int]:
    return {
        t.params["batch_size"]
        for t in trials
        if t.number < before and (t.measurements or {}).get("data", {}).get("gpu_memory")
    }


@pytest.mark.parametrize("strategy", ["grid", "random"])
def test_the_loop_stops_proposing_batches_that_would_not_fit(engine: Engine, strategy: str) -> None:
    job = simulated(engine, strategy, MemoryPolicy(headroom=0.1))
    outcome = job.run(16)
    trials = job.trials()
    asks = {e.details["number"]: e.details["memory_bound"] for e in job.audit("trial.ask")}
    bounded = 0
    for trial in trials:
        if trial.baseline:
            continue  # the job's pre-study config: measured, never asked for
        figures = asks[trial.number]
        if len(measured_batches(trials, trial.number)) < 2:
            assert not figures["applies"] and "2 distinct batch sizes" in figures["why"]
            continue
        bounded += 1
        assert trial.params["batch_size"] <= BOUND, (trial.number, trial.params)
        # The decision says so, with the figures behind it.
        assert figures["applies"] and figures["max_batch"] == BOUND
        assert figures["excluded_from"] == 128
        assert figures["headroom"] == 0.1 and figures["capacity_mib"] == TOTAL_MIB
        assert figures["model"]["fixed_mib"] == pytest.approx(FIXED_MIB)
        assert figures["model"]["per_sample_mib"] == pytest.approx(PER_SAMPLE_MIB)
        assert {p["trial"] for p in figures["points"]} <= {t.number for t in trials}
    assert bounded >= 2, [t.params for t in trials]
    if strategy == "grid":
        # It ran every batch that fits (8..64, both sync periods) and nothing that the bound
        # excludes once it knew; the study ends when only excluded batches are left, and says
        # why.
        assert outcome == "completed"
        ran = {(t.params["batch_size"], t.params["sync_period"]) for t in trials}
        assert {(b, s) for b in (8, 16, 32, 64) for s in (1, 2)} <= ran
        [complete] = job.audit("study.complete")
        assert "memory bound: batch_size <= 124" in complete.details["why"]
    first = next(t for t in trials if t.state == "complete")
    stored = first.measurements["data"]["gpu_memory"]
    assert stored["peak_mib"] == pytest.approx(peak_mib(first.params["batch_size"]))
    assert len(stored["gpus"]) == 2, "the labelled GPU and the registered one"


def test_switched_off_the_loop_tries_what_the_headroom_would_exclude(engine: Engine) -> None:
    job = simulated(engine, "grid", MemoryPolicy(enabled=False))
    job.run(16)
    trials = job.trials()
    assert any(t.params["batch_size"] == 128 and t.state == "complete" for t in trials)
    assert all("memory_bound" not in e.details for e in job.audit("trial.ask"))
    # Readings are still recorded, so switching it on later has a model at once.
    assert all(t.measurements["data"].get("gpu_memory") for t in trials if t.state == "complete")
    with session_scope(session_factory(engine)) as session:
        study = session.get(Study, job.study_id)
        assert study is not None
        assert service.study_memory_bound(study, trials) is None


def test_an_agent_driven_study_is_bounded_by_the_readings_its_agent_tells(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session)
        study = service.create_study(
            session,
            job,
            name="agent",
            objective="throughput",
            space=SPACE,
            strategy="grid",
            options=StudyOptions(driven_by="agent", memory=MemoryPolicy(headroom=0.1)),
        )
        for batch in (8, 32):
            trial = service.ask(session, study)
            trial.params = {"batch_size": batch, "sync_period": 1}
            reading = {"peak_mib": peak_mib(batch), "capacity_mib": TOTAL_MIB}
            service.tell(
                session,
                study,
                trial.number,
                state="complete",
                value=float(batch),
                measurements={service.GPU_MEMORY_KEY: reading},
            )
        # 8..64 x sync 1, 2 fit; two of them ran.
        proposed = [service.ask(session, study).params["batch_size"] for _ in range(6)]
        with pytest.raises(SpaceExhausted, match=r"memory bound: batch_size <= 124"):
            service.ask(session, study)
        entries = session.scalars(
            select(AuditEntry)
            .where(AuditEntry.action == "trial.ask")
            .order_by(AuditEntry.id.desc())
            .limit(1)
        ).all()
        assert max(proposed) <= BOUND, proposed
        assert entries[0].details["memory_bound"]["max_batch"] == BOUND
