"""The per-joule objectives through the tuning loop (SQLite and PostgreSQL): the job's GPUs
report their energy counters to the store as the collectors do (dcgm-exporter's
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ since the driver loaded), the job reports its step
timings, and the loop ranks power limits by the samples per joule those counters measure, with
and without a throughput floor."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select

from tests.tuner import jobsim
from tuneloop.cost import ENERGY_METRIC
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import Trial
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow
from tuner import service
from tuner.loop import reconcile_study
from tuner.measurement import MeasurementPolicy
from tuner.readings import TOKENS_METRIC
from tuner.space import POWER_LIMIT_W, SearchSpace, power_limit_param
from tuner.study_options import StudyOptions

POLICY = MeasurementPolicy(
    warmup_s=10, window_s=20, min_samples=8, max_rel_stderr=0.02, max_age_s=30, max_extensions=2
)
SPACE = SearchSpace((power_limit_param(150, 400),))
LIMITS = (150, 200, 250, 300, 350, 400)  # the grid at resolution 6
START = {"batch_size": 32, POWER_LIMIT_W: 400}
TOKENS_PER_SAMPLE = 128


def per_rank_throughput(limit_w: int) -> float:
    """Samples/s of one rank under a power cap: saturating, as clocks do with power."""
    return 1000.0 * (1 - math.exp(-(limit_w - 100) / 80))


def drawn_w(limit_w: int) -> float:
    """What the GPU draws under the cap (not the cap itself: the value must come from the
    counters)."""
    return 0.9 * limit_w + 20.0


def samples_per_joule(limit_w: int) -> float:
    # Two ranks, one GPU each: the job's throughput over both GPUs' power.
    return 2 * per_rank_throughput(limit_w) / (2 * drawn_w(limit_w))


@dataclass
class EnergyJob:
    """Two ranks on two GPUs: GPU 0 carries the job's label, GPU 1 is the job's by the UUID
    its agent registered; GPU 2, another job's, draws a lot on the same host."""

    engine: Engine
    study_id: int
    job_id: int
    project_id: int
    t0: datetime = field(default_factory=lambda: utcnow() - timedelta(hours=1))
    counters_mj: list[float] = field(default_factory=lambda: [5e9, 7e9, 1e9])

    def at(self, seconds: float) -> datetime:
        return self.t0 + timedelta(seconds=seconds)

    def step(self, seconds: float) -> Any:
        with session_scope(session_factory(self.engine)) as session:
            return reconcile_study(session, self.study_id, now=self.at(seconds))

    def write_energy(self, start: datetime, seconds: int, limit_w: int) -> None:
        labels = [
            {"Hostname": "node-1", "gpu": "0", "UUID": "GPU-0", "job": "train"},
            {"Hostname": "node-1", "gpu": "1", "UUID": "GPU-1"},
            {"Hostname": "node-1", "gpu": "2", "UUID": "GPU-2", "job": "other"},
        ]
        times = [start + timedelta(seconds=i) for i in range(seconds)]
        batches = []
        for index, gpu in enumerate(labels):
            watts = drawn_w(limit_w) if index < 2 else 600.0
            values = [self.counters_mj[index] + 1000.0 * watts * i for i in range(seconds)]
            if index == 1 and limit_w == 250:
                # The driver reloaded mid-window: the counter restarts from 0.
                cut = seconds // 2
                values[cut:] = [1000.0 * watts * (i - cut + 1) for i in range(cut, seconds)]
            self.counters_mj[index] = values[-1] + 1000.0 * watts
            batches.append(SeriesBatch(ENERGY_METRIC, gpu, times, values, SeriesKind.COUNTER))
        result = SampleWriter(self.engine).write(self.project_id, batches)
        assert not result.rejected, result.rejected

    def write_tokens(self, start: datetime, seconds: int, limit_w: int) -> None:
        """Each rank's tokens/s beside its samples/s: TOKENS_PER_SAMPLE per sample."""
        times = [start + timedelta(seconds=0.5 * i) for i in range(2 * seconds)]
        per_rank = per_rank_throughput(limit_w) * TOKENS_PER_SAMPLE
        batches = [
            SeriesBatch(
                TOKENS_METRIC, {"job": "train", "rank": str(rank)}, times, [per_rank] * len(times)
            )
            for rank in range(2)
        ]
        assert not SampleWriter(self.engine).write(self.project_id, batches).rejected

    def run(self) -> list[Trial]:
        for i in range(len(LIMITS) + 2):
            base = 100.0 * i
            result = self.step(base)
            if result.action == "completed":
                break
            assert result.action == "asked", result
            trial = self._trial(result.trial)
            limit = trial.params[POWER_LIMIT_W]
            assert trial.desired_version is not None
            jobsim.report(self.engine, self.job_id, trial.desired_version, at=self.at(base + 1))
            assert self.step(base + 2).action == "applied"
            start = self.at(base + 1)
            jobsim.write_steps(
                self.engine,
                self.project_id,
                "train",
                start=start,
                end=self.at(base + 32),
                per_rank=per_rank_throughput(limit),
            )
            self.write_tokens(start, 32, limit)
            self.write_energy(start, 32, limit)
            told = self.step(base + 32)
            assert told.action == "told", told
        with session_scope(session_factory(self.engine)) as session:
            rows = session.scalars(
                select(Trial).where(Trial.study_id == self.study_id).order_by(Trial.number)
            ).all()
            session.expunge_all()
            return list(rows)

    def _trial(self, number: int) -> Trial:
        with session_scope(session_factory(self.engine)) as session:
            row = session.scalars(
                select(Trial).where(Trial.study_id == self.study_id, Trial.number == number)
            ).one()
            session.expunge(row)
            return row


def energy_job(
    engine: Engine, options: StudyOptions, objective: str = "samples_per_joule"
) -> EnergyJob:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session, labels={"gpu_uuids": "GPU-1"}, config=START)
        study = service.create_study(
            session,
            job,
            name="power",
            objective=objective,
            space=SPACE,
            strategy="grid",
            options=options,
        )
        return EnergyJob(engine, study.id, job.id, job.project_id)


def by_limit(trials: list[Trial]) -> dict[int, Trial]:
    """The trial of each limit: the pre-study config's (400 W, the baseline) and the grid's."""
    return {t.params[POWER_LIMIT_W]: t for t in trials}


def test_samples_per_joule_ranks_power_limits_by_the_counters(engine: Engine) -> None:
    options = StudyOptions(measurement=POLICY, strategy_options={"resolution": len(LIMITS)})
    trials = energy_job(engine, options).run()
    ran = by_limit(trials)
    assert set(ran) == set(LIMITS), sorted(ran)
    for limit, trial in ran.items():
        assert trial.state == "complete", (limit, trial.state, trial.measurements)
        # The value is the samples over the joules the two job GPUs' counters grew by (the
        # other job's GPU and the reset of GPU 1 at 250 W do not count).
        assert trial.value == pytest.approx(samples_per_joule(limit), rel=0.02), limit
        reading = trial.measurements["data"]["gpu_power"]
        assert reading["watts"] == pytest.approx(2 * drawn_w(limit), rel=0.02)
        assert {g["UUID"] for g in reading["gpus"]} == {"GPU-0", "GPU-1"}
        assert trial.measurements["data"]["inputs"]["throughput_floor"] == 0.0
    ranked = sorted(ran, key=lambda limit: -(ran[limit].value or 0.0))
    # 200 W does the most samples per joule; the job's 400 W default the fewest.
    assert ranked == sorted(LIMITS, key=lambda limit: -samples_per_joule(limit))
    assert ranked[0] == 200 and ranked[-1] == 400


def test_the_throughput_floor_makes_frugal_but_slow_limits_infeasible(engine: Engine) -> None:
    floor = 2 * per_rank_throughput(240)  # 200 W and below are too slow
    options = StudyOptions(
        measurement=POLICY,
        strategy_options={"resolution": len(LIMITS)},
        throughput_floor=floor,
    )
    trials = energy_job(engine, options).run()
    ran = by_limit(trials)
    for limit in (150, 200):
        assert ran[limit].state == "infeasible", ran[limit].state
        assert "throughput_floor" in ran[limit].measurements["reason"]
    feasible = {limit: t for limit, t in ran.items() if t.state == "complete"}
    assert set(feasible) == {250, 300, 350, 400}
    assert max(feasible.values(), key=lambda t: t.value or 0.0).params[POWER_LIMIT_W] == 250


def test_the_floor_is_only_for_the_per_joule_objectives(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session, config=START)
        with pytest.raises(service.StudyError, match="throughput_floor is for the"):
            service.create_study(
                session,
                job,
                name="s",
                objective="throughput",
                space=SPACE,
                strategy="grid",
                options=StudyOptions(throughput_floor=10.0),
            )


def test_tokens_per_joule_judges_the_tokens_series(engine: Engine) -> None:
    options = StudyOptions(
        measurement=POLICY, strategy_options={"resolution": len(LIMITS)}, max_trials=2
    )
    trials = energy_job(engine, options, objective="tokens_per_joule").run()
    measured = [t for t in trials if t.state == "complete"]
    assert len(measured) >= 2
    for trial in measured:
        limit = trial.params[POWER_LIMIT_W]
        expected = TOKENS_PER_SAMPLE * samples_per_joule(limit)
        assert trial.value == pytest.approx(expected, rel=0.02), limit
        assert trial.measurements["data"]["window"]["metric"] == TOKENS_METRIC
