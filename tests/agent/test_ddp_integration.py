"""End to end: a real 2-rank DistributedDataParallel job (gloo, CPU, digits) with the agent,
against a live API on PostgreSQL. Two config changes pushed through the API are applied by
both ranks at the same step and acknowledged; the step timings stored from the job's spans
show each config's samples per step from that step on; a deliberately bad config (a tiny
batch: throughput collapses) is rolled back by the actuator and marked bad."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tests.agent.conftest import Live
from tests.agent.ddp import both_exit_cleanly, rank_results, stored_steps, two_ranks, until
from tuneloop.demo.job import save_digits
from tuneloop.storage import session_scope
from tuneloop.storage.models import AuditEntry

JOB = "digits"
CHANGES = [
    {"batch_size": 32, "sync_period": 1},
    {"batch_size": 64, "sync_period": 2},
]
BAD = {"batch_size": 2, "sync_period": 1}


def _actuator_audit(live: Live) -> list[tuple[str, Any]]:
    with session_scope(live.runtime.sessions) as session:
        return [
            (e.action, e.details.get("message"))
            for e in session.scalars(
                select(AuditEntry).where(AuditEntry.actor == "actuator").order_by(AuditEntry.id)
            )
        ]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_two_rank_ddp_job_applies_changes_at_one_step_and_rolls_back_a_bad_one(
    live: Live, tmp_path: Path
) -> None:
    member = httpx.Client(headers={"Authorization": f"Bearer {live.member_token}"})
    jobs = f"{live.url}/api/v1/projects/{live.project}/jobs"
    assert member.post(jobs, json={"name": JOB, "status": "running"}).status_code == 201
    policy = {"verify": {"settle_s": 1, "window_s": 4, "min_samples": 4, "noise_sigmas": 3}}
    assert member.put(f"{jobs}/{JOB}/actuator", json=policy).status_code == 200

    def observed() -> int:
        state = member.get(f"{jobs}/{JOB}/config").json()
        return int(state["observed"]["version"]) if state["observed"] else 0

    def desire(config: dict[str, int]) -> int:
        response = member.put(f"{jobs}/{JOB}/config", json={"config": config})
        assert response.status_code == 200, response.text
        return int(response.json()["version"])

    stop, data = tmp_path / "stop", tmp_path / "digits.npz"
    save_digits(data)
    # The demo's job (tuneloop.demo.job), without its emulated interconnect; the input delay
    # makes throughput depend on the batch size, as on real hardware.
    command = [sys.executable, "-m", "tuneloop.demo.job", "tune", live.url, live.agent_token]
    command += [live.project, JOB, str(data), str(tmp_path), "--stop-file", str(stop)]
    command += ["--batch-size", "16", "--sync-period", "1"]
    command += ["--input-delay-ms", "4", "--sync-latency-ms", "0"]
    with two_ranks(command) as ranks_running:
        job = ranks_running[0]
        until(lambda: observed() == 1, 120, "the starting config was adopted", job)
        for config in CHANGES:
            version = desire(config)
            until(lambda v=version: observed() == v, 40, f"version {version} ran", job)  # type: ignore[misc]
        # The actuator verifies a change against measurements of the config before it, and
        # keeps a change it has nothing to measure against: wait for the job's step timings
        # to reach the store (the exporters' first batches take a few seconds).
        until(lambda: len(stored_steps(live, "0", JOB)) >= 8, 60, "stored step timings", job)
        bad = desire(BAD)
        # Released once the previous change is verified, measured, then rolled back.
        try:
            until(lambda: observed() > bad, 180, "the bad config was rolled back", job)
        except AssertionError as exc:  # say where the actuator stands
            state = member.get(f"{jobs}/{JOB}/actuator").json()
            audit = _actuator_audit(live)
            raise AssertionError(f"{exc}; actuator: {state}; audit: {audit}") from None
        both_exit_cleanly(ranks_running, stop)
    member.close()

    ranks = rank_results(tmp_path)
    history = [tuple(entry) for entry in ranks[0]["history"]]
    assert [version for version, _ in history] == [2, 3, 4, 5]
    steps = [step for _, step in history]
    assert steps == sorted(steps)
    for result in ranks:
        assert result["config"] == CHANGES[-1]  # back on the last good config
        assert result["noise_scale"] is None or result["noise_scale"] > 0

    with session_scope(live.runtime.sessions) as session:
        acks = [
            (e.details["version"], e.details["step"])
            for e in session.scalars(
                select(AuditEntry)
                .where(AuditEntry.action == "job.config.ack")
                .order_by(AuditEntry.id)
            )
        ]
        rollbacks = list(
            session.scalars(select(AuditEntry).where(AuditEntry.action == "actuator.rollback"))
        )
    assert acks == [(1, None), *history]
    assert len(rollbacks) == 1 and rollbacks[0].details["version"] == 4
    marks = httpx.get(
        f"{jobs}/{JOB}/config/marks", headers={"Authorization": f"Bearer {live.member_token}"}
    ).json()
    assert [(m["version"], m["config"]) for m in marks] == [(4, BAD)]

    # The stored step timings: each step's samples are the batch x sync period of the config
    # that rank ran at that step.
    configs = {1: {"batch_size": 16, "sync_period": 1}, 2: CHANGES[0], 3: CHANGES[1], 4: BAD}
    configs[5] = CHANGES[1]
    for rank in ("0", "1"):
        stored = stored_steps(live, rank, JOB)
        assert len(stored) > 0.9 * ranks[int(rank)]["steps"]
        for step, per_step in stored.items():
            version = max([1] + [v for v, s in history if s <= step])
            config = configs[version]
            assert per_step == pytest.approx(config["batch_size"] * config["sync_period"], rel=1e-6)
