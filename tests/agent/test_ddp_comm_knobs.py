"""The built-in DDP knobs on a real 2-rank DDP job (gloo, CPU, ``tests/agent/ddp_knob_job``):
``bucket_mb`` and ``grad_compression`` are declared when the agent registers; a released
config changing both re-wraps the model in a new DDP with the new bucket cap and all-reduces
in fp16 from the same step on both ranks, whose weights stay identical, and is acknowledged.
A bad declaration is refused by the API naming the knob."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from tests.agent.conftest import Live
from tests.agent.ddp import both_exit_cleanly, rank_results, two_ranks, until

JOB = "ddp-knobs"
CHANGED = {"batch_size": 8, "bucket_mb": 1, "grad_compression": True}


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_bucket_size_and_compression_change_at_one_step(live: Live, tmp_path: Path) -> None:
    member = httpx.Client(headers={"Authorization": f"Bearer {live.member_token}"})
    job_url = live.job_url(JOB)

    def observed() -> int:
        response = member.get(f"{job_url}/config")
        if response.status_code == 404:
            return 0  # the agent creates its job when it registers
        state = response.json()
        return int(state["observed"]["version"]) if state["observed"] else 0

    command = [sys.executable, "-m", "tests.agent.ddp_knob_job", live.url, live.agent_token]
    command += [live.project, JOB, str(tmp_path)]
    with two_ranks(command) as ranks:
        until(lambda: observed() == 1, 120, "the starting config was adopted", ranks[0])
        knobs = member.get(f"{job_url}/agents").json()[-1]["knobs"]
        assert {k["name"]: k["default"] for k in knobs} == {
            "bucket_mb": 25,
            "grad_compression": False,
        }
        response = member.put(f"{job_url}/config", json={"config": CHANGED})
        assert response.status_code == 200, response.text
        version = int(response.json()["version"])
        until(lambda: observed() == version, 60, f"version {version} ran", ranks[0])
        both_exit_cleanly(ranks)
    member.close()
    results = rank_results(tmp_path)
    for result in results:
        assert result["knobs"] == {"bucket_mb": 1, "grad_compression": True}
        assert result["bucket_bytes_cap"] == 1024 * 1024
        assert result["wrappers"] == 2  # re-wrapped once, for the new bucket size
        assert result["ranks_agree"]  # the fp16 all-reduce left both ranks the same weights


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("knob", "named"),
    [
        ({"name": "loader_workers", "type": "int", "low": 4, "high": 2, "default": 3}, "inverted"),
        ({"name": "loader_workers", "type": "int", "low": 0, "high": 8}, "'default'"),
        ({"name": "loader_workers", "type": "int", "low": 0, "high": 8, "default": 9}, "outside"),
        ({"name": "grad_compression", "type": "bool", "default": True}, "unknown type"),
    ],
)
def test_a_bad_knob_declaration_is_refused_naming_it(
    live: Live, knob: dict[str, object], named: str
) -> None:
    headers = {"Authorization": f"Bearer {live.agent_token}"}
    jobs = live.job_url(JOB).rsplit("/", 1)[0]
    httpx.post(jobs, json={"name": JOB, "status": "running"}, headers=headers)
    body = {"host": "node-1", "world_size": 1, "ranks": [{"rank": 0}], "knobs": [knob]}
    response = httpx.post(f"{live.job_url(JOB)}/agents", json=body, headers=headers)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert repr(knob["name"]) in detail and named in detail, detail
    agents = httpx.get(f"{live.job_url(JOB)}/agents", headers=headers).json()
    assert agents == []  # nothing of the refused registration was stored
