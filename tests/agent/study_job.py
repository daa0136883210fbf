"""A stand-in for a training job under a tuning study, against a live API (``live``): its
agent, its step timings, and the study's passes run here, for the tests of a study's end."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import httpx
from sqlalchemy import select

from tests.agent.conftest import Live
from tests.tuner import jobsim
from tuneloop.agent import Agent, RankInfo
from tuneloop.demo.processes import until as wait_until
from tuneloop.storage import session_scope
from tuneloop.storage.models import Job, Project, Study, Trial
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.types import utcnow
from tuner.loop import StepResult, reconcile_study
from tuner.readings import THROUGHPUT_METRIC, has_series

T = TypeVar("T")
JOB = "mlp"
START = {"batch_size": 32, "sync_period": 1}
RANKS = [RankInfo(0, ()), RankInfo(1, ())]
MEASUREMENT = {"warmup_s": 0.5, "window_s": 1.5, "min_samples": 4}


def until(probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """The demo's wait (``DemoError`` on a timeout), polling every 50 ms."""
    return wait_until(probe, timeout_s, what, interval_s=0.05)


@contextmanager
def running_job(
    live: Live, *, wobble: float = 0.005, reporting: threading.Event | None = None
) -> Iterator[Agent]:
    """A stand-in for a training job: its agent applies every released config at the next
    step and acknowledges it, and its ranks report step timings (10 samples/s per sample of
    batch, ``wobble`` from one sample to the next) to the store every 0.25 s, as the job's
    exporters would, while ``reporting`` is set."""
    agent = Agent(
        url=live.url,
        token=live.agent_token,
        project=live.project,
        job=JOB,
        world_size=2,
        instrument=False,
        poll_timeout_s=2,
    )
    agent.start(dict(START), RANKS)
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.wait(0.25):
            step += 1
            pending = agent.pending()
            if pending is not None:
                agent.applied(pending.version, pending.config, step)
            if agent.agent_id is None or (reporting is not None and not reporting.is_set()):
                continue
            now = utcnow()
            jobsim.write_steps(
                live.runtime.engine,
                project_id(live),
                JOB,
                start=now,
                end=now + timedelta(seconds=0.25),
                per_rank=10.0 * int(agent.config.get("batch_size", 1)),
                every_s=0.125,
                wobble=wobble,
            )

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        stop.set()
        thread.join(5)
        agent.close()


def project_id(live: Live) -> int:
    with session_scope(live.runtime.sessions) as session:
        return session.scalars(select(Project.id).where(Project.name == live.project)).one()


def create_study(live: Live, **overrides: Any) -> dict[str, Any]:
    body = {
        "name": "batch",
        "objective": "throughput",
        "strategy": "grid",
        "space": {"batch_size": [8, 64], "sync_period": [1, 2], "lr_scaling": None},
        "measurement": MEASUREMENT,
        **overrides,
    }
    response = httpx.post(
        f"{live.job_url(JOB)}/studies",
        json=body,
        headers={"Authorization": f"Bearer {live.member_token}"},
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def loop_pass(live: Live, study_id: int) -> StepResult:
    with session_scope(live.runtime.sessions) as session:
        return reconcile_study(session, study_id, now=utcnow())


def study(live: Live, study_id: int) -> Study:
    with session_scope(live.runtime.sessions) as session:
        row = session.get_one(Study, study_id)
        session.expunge(row)
        return row


def passes_until(live: Live, study_id: int, done: Callable[[], bool], what: str) -> None:
    def step() -> bool:
        loop_pass(live, study_id)
        return done()

    until(step, 60, what)


def trial_states(live: Live, study_id: int) -> list[str]:
    with session_scope(live.runtime.sessions) as session:
        query = select(Trial.state).where(Trial.study_id == study_id).order_by(Trial.number)
        return list(session.scalars(query))


def has_steps(live: Live) -> bool:
    with live.runtime.engine.connect() as connection:
        return has_series(StoreBackend(connection), project_id(live), JOB, THROUGHPUT_METRIC)


def desired_configs(live: Live) -> list[tuple[int, dict[str, Any], str]]:
    rows = jobsim.desired(live.runtime.engine, job_id(live))
    return [(r.version, dict(r.config), r.source) for r in rows]


def job_id(live: Live) -> int:
    with session_scope(live.runtime.sessions) as session:
        return session.scalars(select(Job.id).where(Job.name == JOB)).one()
