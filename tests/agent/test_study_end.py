"""A tuning study's end seen by the job: a real agent against a live API on each backend, the
tuning loop's passes run here. Whether the study is cancelled, or the job stops acknowledging
and comes back, the agent ends up running the config it ran before the study."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import httpx
import pytest
from sqlalchemy import select

from tests.agent.conftest import Live
from tests.tuner import jobsim
from tuneloop.agent import Agent, RankInfo
from tuneloop.job_configs import study_outcome_source
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


def until(probe: Callable[[], T], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


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
                _project_id(live),
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


def _project_id(live: Live) -> int:
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


def test_a_cancelled_study_puts_the_job_back_on_its_config(live: Live) -> None:
    with running_job(live) as agent:
        until(lambda: agent.version == 1, 10, "the starting config to be adopted")
        until(lambda: _has_steps(live), 10, "step timings in the store")
        created = create_study(live)
        # The pre-study config is measured, then the first proposal reaches the job.
        passes_until(live, created["id"], lambda: agent.version == 2, "trial 2 to run")
        assert agent.config != START
        answer = httpx.delete(
            f"{live.job_url(JOB)}/studies/batch",
            headers={"Authorization": f"Bearer {live.member_token}"},
        )
        assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
        until(lambda: agent.version == 3, 10, "the job to get the outcome config")
        assert agent.config == START
    ended = study(live, created["id"])
    assert ended.outcome_version == 3
    [outcome] = [r for r in _desired(live) if r[0] == 3]
    assert outcome == (3, START, study_outcome_source(created["id"]))


@pytest.mark.parametrize("job_side", ["silent", "noisy"])
def test_a_study_with_nothing_better_to_show_leaves_the_job_on_its_config(
    live: Live, job_side: str
) -> None:
    """Silent: the job stops reporting step timings once the study exists, so no trial is
    ever measured. Noisy: every window swings ±50%, so no trial beats the pre-study config
    beyond the noise (or, with noisy windows failing, none is measured)."""
    reporting = threading.Event()
    reporting.set()
    wobble = 0.5 if job_side == "noisy" else 0.005
    with running_job(live, wobble=wobble, reporting=reporting) as agent:
        until(lambda: agent.version == 1, 10, "the starting config to be adopted")
        until(lambda: _has_steps(live), 10, "step timings in the store")
        # One extension, not three: a trial that measures nothing (silent) or only noise
        # (noisy) spends its whole budget either way, and the outcome is the same.
        quick = {**MEASUREMENT, "max_extensions": 1}
        created = create_study(live, max_trials=2, strategy="random", seed=1, measurement=quick)
        if job_side == "silent":
            reporting.clear()
        ended = lambda: study(live, created["id"]).state != "running"  # noqa: E731
        passes_until(live, created["id"], ended, "the study to end")
        back = lambda: agent.config == START and agent.pending() is None  # noqa: E731
        until(back, 10, "the job back on its pre-study config")
    row = study(live, created["id"])
    assert row.state in ("complete", "failed"), row.end_reason
    if job_side == "silent":
        assert row.state == "failed" and "the job stays on its pre-study config" in row.end_reason
    assert _desired(live)[-1][1] == START


def test_a_job_that_stops_acknowledging_fails_the_study_and_restarts_on_its_config(
    live: Live,
) -> None:
    with running_job(live) as agent:
        until(lambda: agent.version == 1, 10, "the starting config to be adopted")
        until(lambda: _has_steps(live), 10, "step timings in the store")
        # Trial 2 finds the job gone (or going): a short ack timeout only ends the study sooner.
        created = create_study(live, ack_timeout_s=1)
        measured = lambda: trial_states(live, created["id"]) == ["complete"]  # noqa: E731
        passes_until(live, created["id"], measured, "the baseline to be measured")
    # The job is gone (its agent closed) before trial 2 is proposed: the study does not wait.
    passes_until(
        live, created["id"], lambda: study(live, created["id"]).state != "running", "the end"
    )
    ended = study(live, created["id"])
    assert ended.state == "failed" and "the job stopped acknowledging" in ended.end_reason
    assert ended.outcome_version == 3
    # Restarted, the job comes back on its pre-study config, not on the trial's.
    with running_job(live) as restarted:
        # Version 3 when trial 2 was released before the job went (the restarted job gets it,
        # then the outcome); else the job still runs version 1, the same config, and version 3
        # needs no release of its own.
        back = lambda: restarted.version in (1, 3) and restarted.pending() is None  # noqa: E731
        until(back, 15, "the restarted job on the pre-study config")
        assert restarted.config == START


def trial_states(live: Live, study_id: int) -> list[str]:
    with session_scope(live.runtime.sessions) as session:
        query = select(Trial.state).where(Trial.study_id == study_id).order_by(Trial.number)
        return list(session.scalars(query))


def _has_steps(live: Live) -> bool:
    with live.runtime.engine.connect() as connection:
        return has_series(StoreBackend(connection), _project_id(live), JOB, THROUGHPUT_METRIC)


def _desired(live: Live) -> list[tuple[int, dict[str, Any], str]]:
    rows = jobsim.desired(live.runtime.engine, _job_id(live))
    return [(r.version, dict(r.config), r.source) for r in rows]


def _job_id(live: Live) -> int:
    with session_scope(live.runtime.sessions) as session:
        return session.scalars(select(Job.id).where(Job.name == JOB)).one()
