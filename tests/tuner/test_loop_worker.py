"""The tuning loop on real processes: `tuneloop beat` and `tuneloop worker` on the local Redis
and PostgreSQL, workers SIGKILLed inside a pass and in the middle of a trial, and a new one
resuming the study; and the same loop in-process, without Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text

from tests.conftest import reset_postgres
from tests.helpers import wait_for
from tests.tuner import jobsim
from tuneloop.settings import configure, load_settings
from tuneloop.storage import make_engine, migrate, session_factory, session_scope
from tuneloop.storage.models import AuditEntry, Job, Study, Trial
from tuneloop.storage.types import utcnow
from tuneloop.taskqueue import maintenance, periodic_tasks
from tuneloop.taskqueue.registry import TUNER_DISPATCH
from tuner import service
from tuner.loop import reconcile_study
from tuner.measurement import MeasurementPolicy
from tuner.space import SearchSpace
from tuner.study_options import StudyOptions

ROOT = Path(__file__).resolve().parents[2]
SPACE = SearchSpace.training((8, 64), (1, 2), sync_powers_of_two=True, base_lr=0.1, base_batch=32)
POLICY = MeasurementPolicy(
    warmup_s=1, window_s=4, min_samples=4, max_rel_stderr=0.05, max_age_s=120, max_extensions=1
)


def create_study(engine: Engine) -> tuple[int, int, int]:
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session)
        study = service.create_study(
            session,
            job,
            name="batch",
            objective="goodput",
            space=SPACE,
            strategy="bayesian",
            seed=0,
            options=StudyOptions(measurement=POLICY, ranks=2, max_trials=3),
        )
        ids = study.id, job.id, job.project_id
    measure_baseline(engine, *ids)
    return ids


def measure_baseline(engine: Engine, study_id: int, job_id: int, project_id: int) -> None:
    """Trial 1, the job's pre-study config (desired version 1), measured in-process over a
    window that ended 40 s ago (clear of the trials' windows): slower than anything the study
    tries next, so its best is applied."""
    start, end = utcnow() - timedelta(seconds=60), utcnow() - timedelta(seconds=40)
    with session_scope(session_factory(engine)) as session:
        assert reconcile_study(session, study_id, now=start).trial == 1
    jobsim.report(engine, job_id, 1, at=start)
    jobsim.write_steps(
        engine, project_id, "train", start=start, end=end, per_rank=50.0, noise_scale=400.0
    )
    for expected in ("applied", "told"):
        with session_scope(session_factory(engine)) as session:
            assert reconcile_study(session, study_id, now=end).action == expected


def trial_rows(engine: Engine, study_id: int) -> list[Trial]:
    with session_scope(session_factory(engine)) as session:
        rows = session.scalars(
            select(Trial).where(Trial.study_id == study_id).order_by(Trial.number)
        ).all()
        session.expunge_all()
        return list(rows)


def audit_counts(engine: Engine) -> dict[str, int]:
    with session_scope(session_factory(engine)) as session:
        rows = session.execute(
            select(AuditEntry.action, func.count()).group_by(AuditEntry.action)
        ).all()
        return {action: int(count) for action, count in rows}


def waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as connection:
        waiting = connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
    return bool(waiting)


def run_trial_on_the_job_side(engine: Engine, job_id: int, project_id: int, version: int) -> None:
    """The agent applied ``version`` 20 s ago and has reported steps since."""
    now = utcnow()
    jobsim.report(engine, job_id, version, at=now - timedelta(seconds=20))
    jobsim.write_steps(
        engine,
        project_id,
        "train",
        start=now - timedelta(seconds=20),
        end=now,
        per_rank=100.0 + 10 * version,
        noise_scale=400.0,
    )


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuneloop", *args], env=env, stdout=out, stderr=out, cwd=ROOT
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


@pytest.mark.redis
@pytest.mark.postgres
def test_workers_killed_mid_pass_and_mid_trial_and_a_new_one_resumes(
    postgres_server_url: str, redis_url: str, tmp_path: Path
) -> None:
    reset_postgres(postgres_server_url)
    migrate.upgrade(postgres_server_url)
    engine = make_engine(postgres_server_url)
    study_id, job_id, project_id = create_study(engine)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TUNELOOP_DATABASE_URL": postgres_server_url,
        "TUNELOOP_REDIS_URL": redis_url,
        # A queue of its own: other test runs may share this Redis database.
        "TUNELOOP_TASK_QUEUE": f"tuneloop-test-{uuid.uuid4().hex}",
        "TUNELOOP_DATA_DIR": str(tmp_path),
        "TUNELOOP_TUNER_INTERVAL_S": "0.5",
        "TUNELOOP_MAINTENANCE_INTERVAL_S": "3600",
        "TUNELOOP_LOG_LEVEL": "info",
    }
    worker_args = ["worker", "--pool", "solo", "--concurrency", "1"]

    def running_trial(number: int) -> bool:
        rows = trial_rows(engine, study_id)
        return len(rows) >= number and rows[number - 1].desired_version == number

    with process(["beat"], env, tmp_path / "beat.log"):
        # 1. Killed inside a pass: the job row is held, so the worker's first pass stops
        # between storing trial 2 and writing its desired config, uncommitted.
        with engine.connect() as holder, holder.begin():
            holder.execute(select(Job.id).where(Job.id == job_id).with_for_update())
            with process(worker_args, env, tmp_path / "worker0.log") as doomed:
                wait_for(
                    lambda: waiting_on_a_lock(engine), 60, "a pass to block mid-way", every_s=0.2
                )
                doomed.send_signal(signal.SIGKILL)
                doomed.wait(10)
        wait_for(
            lambda: not waiting_on_a_lock(engine), 30, "the dead pass to roll back", every_s=0.2
        )
        assert [t.number for t in trial_rows(engine, study_id)] == [1], "the baseline alone"
        assert [v.version for v in jobsim.desired(engine, job_id)] == [1]

        # 2. Killed in the middle of a trial: proposed and written, not yet measured.
        with process(worker_args, env, tmp_path / "worker1.log") as first:
            wait_for(lambda: running_trial(2), 60, "the next worker to start trial 2", every_s=0.2)
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        assert [t.state for t in trial_rows(engine, study_id)] == ["complete", "running"]

        # While no worker runs, the job applies the trial and reports its steps.
        run_trial_on_the_job_side(engine, job_id, project_id, 2)
        time.sleep(1.0)  # beat keeps enqueueing; the ticks that expire meanwhile are dropped
        assert [t.state for t in trial_rows(engine, study_id)] == ["complete", "running"]

        # 3. A new worker measures trial 2, runs trial 3 and completes the study.
        with process(worker_args, env, tmp_path / "worker2.log"):
            wait_for(
                lambda: running_trial(3), 60, "the second worker to measure 2, start 3", every_s=0.2
            )
            run_trial_on_the_job_side(engine, job_id, project_id, 3)

            def completed() -> bool:
                with session_scope(session_factory(engine)) as session:
                    study = session.get(Study, study_id)
                    return study is not None and study.state == "complete"

            wait_for(completed, 60, "the study to complete", every_s=0.2)

    trials = trial_rows(engine, study_id)
    assert [(t.number, t.state, t.desired_version) for t in trials] == [
        (1, "complete", 1),
        (2, "complete", 2),
        (3, "complete", 3),
    ]
    values = [t.value for t in trials]
    assert all(v is not None and v > 0 for v in values)
    assert min(v or 0.0 for v in values[1:]) > (values[0] or 0.0), "faster on the new versions"
    top = max(trials[1:], key=lambda t: t.value or 0.0)
    versions = jobsim.desired(engine, job_id)
    assert [v.version for v in versions] == [1, 2, 3, 4], "pre-study, one per trial, best"
    assert versions[-1].config == top.params
    counts = audit_counts(engine)
    for action, expected in {
        "trial.baseline": 1,
        "trial.ask": 2,
        "trial.apply": 2,
        "trial.applied": 3,
        "trial.tell": 3,
        "study.complete": 1,
    }.items():
        assert counts.get(action) == expected, (action, counts)
    engine.dispose()


@pytest.fixture
def _in_process_settings(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'tuneloop.db'}"
    configure(load_settings(database_url=url, redis_url=None, data_dir=str(tmp_path)))
    yield url
    maintenance.close_task_runtime()
    configure(load_settings())


def test_the_embedded_default_runs_the_loop_in_process(_in_process_settings: str) -> None:
    url = _in_process_settings
    migrate.upgrade(url)
    engine = make_engine(url)
    study_id, job_id, project_id = create_study(engine)
    [dispatch] = [t for t in periodic_tasks(load_settings()) if t.name == TUNER_DISPATCH]

    dispatch.func()
    assert [t.desired_version for t in trial_rows(engine, study_id)] == [1, 2]
    dispatch.func()  # a repeated tick: nothing new
    assert len(trial_rows(engine, study_id)) == 2

    run_trial_on_the_job_side(engine, job_id, project_id, 2)
    dispatch.func()  # acknowledged
    dispatch.func()  # measured and told
    dispatch.func()  # trial 3 asked
    assert [(t.state, t.desired_version) for t in trial_rows(engine, study_id)] == [
        ("complete", 1),
        ("complete", 2),
        ("running", 3),
    ]
    engine.dispose()
