"""A job's own knobs, end to end: the demo's real 2-rank DDP job (gloo, CPU) loading through a
real DataLoader whose batches pay an input latency declares ``loader_workers`` and
``prefetch_factor`` when its agent registers; its diagnosis is input-bound and a study from
it searches exactly those knobs; a released config that changes them is applied by both
ranks at one step and acknowledged, and the loader then runs that many worker processes; a
bad declaration or an out-of-range value is refused naming the knob."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from tests.agent.conftest import Live
from tests.agent.ddp import both_exit_cleanly, rank_results, stored_steps, two_ranks, until
from tuneloop.demo.job import save_digits

JOB = "loader"
START = {"batch_size": 8, "sync_period": 1, "loader_workers": 0, "prefetch_factor": 2}
TUNED = {**START, "loader_workers": 3, "prefetch_factor": 3}


def job_command(live: Live, tmp_path: Path) -> list[str]:
    data = tmp_path / "digits.npz"
    save_digits(data)
    command = [sys.executable, "-m", "tuneloop.demo.job", "tune", live.url, live.agent_token]
    command += [live.project, JOB, str(data), str(tmp_path), "--stop-file", str(tmp_path / "stop")]
    command += ["--batch-size", "8", "--loader-workers", "0", "--loader-prefetch", "2"]
    return [*command, "--input-delay-ms", "30", "--sync-latency-ms", "0"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_declared_loader_knobs_are_tuned_from_the_diagnosis_and_applied_at_one_step(
    live: Live, tmp_path: Path
) -> None:
    member = httpx.Client(headers={"Authorization": f"Bearer {live.member_token}"})
    job_url = live.job_url(JOB)
    jobs = job_url.rsplit("/", 1)[0]
    assert member.post(jobs, json={"name": JOB, "status": "running"}).status_code == 201

    def observed() -> int:
        state = member.get(f"{job_url}/config").json()
        return int(state["observed"]["version"]) if state["observed"] else 0

    with two_ranks(job_command(live, tmp_path)) as ranks_running:
        job = ranks_running[0]
        until(lambda: observed() == 1, 120, "the starting config was adopted", job)
        agent = member.get(f"{job_url}/agents").json()[-1]
        assert {k["name"]: (k["low"], k["high"], k["default"]) for k in agent["knobs"]} == {
            "loader_workers": (0, 6, 0),
            "prefetch_factor": (1, 4, 2),
        }
        # A CPU rank has no GPU, and a host all the same.
        assert [(r["rank"], r["gpu_uuids"], bool(r["host"])) for r in agent["ranks"]] == [
            (0, [], True),
            (1, [], True),
        ]
        assert member.get(f"{job_url}/config").json()["desired"]["config"] == START

        # Out of the declared range: refused by the API, naming the knob.
        refused = member.put(f"{job_url}/config", json={"config": {**START, "loader_workers": 99}})
        assert refused.status_code == 422
        assert "loader_workers=99" in refused.json()["detail"]

        until(lambda: len(stored_steps(live, "0", JOB)) >= 20, 90, "stored step timings", job)
        diagnosis = member.get(f"{job_url}/diagnosis", params={"window": "1m"}).json()
        assert diagnosis["verdict"] == "input_bound", diagnosis
        created = member.post(
            f"{job_url}/studies/from-diagnosis", json={"name": "loader", "window": "1m"}
        )
        assert created.status_code == 201, created.text
        study = created.json()
        assert study["verdict"] == "input_bound"
        assert study["knobs"] == ["loader_workers", "prefetch_factor"]
        assert study["objective"] == "throughput"
        assert [p["name"] for p in study["space"]["params"]] == study["knobs"]
        # No loop runs here to carry the study out; the config is set by hand below.
        assert member.delete(f"{job_url}/studies/loader").status_code == 200

        version = int(member.put(f"{job_url}/config", json={"config": TUNED}).json()["version"])
        until(lambda: observed() == version, 60, f"version {version} ran", job)
        both_exit_cleanly(ranks_running, tmp_path / "stop")
    member.close()

    ranks = rank_results(tmp_path)
    assert [v for v, _ in ranks[0]["history"]] == [version]
    for rank in ranks:
        assert rank["knobs"] == {"loader_workers": 3, "prefetch_factor": 3}
        assert rank["config"] == TUNED
        assert rank["worker_processes"] == 3  # the loader really runs three workers
