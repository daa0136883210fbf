"""Studies through the API on real SQLite and PostgreSQL: creation and its refusals, reading
trials and the best config, ask/tell for agents, project scoping."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.api.conftest import Minter, bearer
from tests.tuner import jobsim
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import AuditEntry, Job, JobAgent
from tuneloop.storage.types import utcnow
from tuner.loop import StepResult, reconcile_study

JOBS = "/api/v1/projects/alpha/jobs"
STUDIES = f"{JOBS}/train/studies"
SPACE: dict[str, Any] = {
    "batch_size": [8, 64],
    "sync_period": [1, 2],
    "sync_powers_of_two": True,
    "base_lr": 0.1,
    "base_batch": 32,
}

START_CONFIG = {"batch_size": 32, "sync_period": 1}
AGENT: dict[str, Any] = {
    "host": "node-7",
    "world_size": 4,
    "ranks": [{"rank": r, "gpu_uuids": []} for r in range(4)],
    "config": START_CONFIG,
}


@pytest.fixture
def auth(mint: Minter, client: TestClient, runtime: Runtime) -> dict[str, dict[str, str]]:
    project_id = mint.project("alpha")
    mint.project("beta")
    secrets = {
        "member": bearer(mint.token("alpha", "member", "alice")),
        "agent": bearer(mint.token("alpha", "agent", "node-7")),
        "stranger": bearer(mint.token("beta", "member", "bob")),
    }
    for name in ("train", "silent", "unserved"):
        created = client.post(JOBS, json={"name": name}, headers=secrets["member"])
        assert created.status_code == 201
    now = utcnow()
    for name in ("train", "unserved"):
        jobsim.write_steps(
            runtime.engine,
            project_id,
            name,
            start=now - timedelta(seconds=30),
            end=now,
            per_rank=100.0,
            ranks=4,
        )
    # The job's agent registers the config it started with: the pre-study config of studies.
    registered = client.post(f"{JOBS}/train/agents", json=AGENT, headers=secrets["agent"])
    assert registered.status_code == 201, registered.text
    return secrets


def loop_pass(runtime: Runtime, study_id: int) -> StepResult:
    """One pass of the tuning loop over the study, now, as the periodic task runs it."""
    with session_scope(runtime.sessions) as session:
        return reconcile_study(session, study_id, now=utcnow())


def body(**overrides: Any) -> dict[str, Any]:
    return {"name": "s", "space": SPACE, "seed": 1, **overrides}


def test_create_read_and_list(client: TestClient, auth: dict[str, dict[str, str]]) -> None:
    member = auth["member"]
    measurement = {"warmup_s": 30, "warmup_samples": 2, "window_s": 60.5, "min_samples": 10}
    created = client.post(STUDIES, json=body(max_trials=5, measurement=measurement), headers=member)
    assert created.status_code == 201, created.text
    study = created.json()
    assert study["objective"] == "goodput", "the default for a training job"
    assert study["strategy"] == "bayesian"
    assert study["state"] == "running"
    assert study["seed"] == 1
    assert study["options"]["ranks"] == 4, "taken from the ranks reporting step timings"
    assert study["options"]["max_trials"] == 5
    assert study["options"]["driven_by"] == "tuner"
    stored = study["options"]["measurement"]
    assert {k: stored[k] for k in measurement} == measurement
    assert isinstance(stored["warmup_samples"], int) and isinstance(stored["min_samples"], int)
    assert study["space"]["params"][0]["name"] == "batch_size"

    assert client.get(f"{STUDIES}/s", headers=member).json() == study
    assert client.get(f"{STUDIES}/{study['id']}", headers=auth["agent"]).json() == study
    assert [s["id"] for s in client.get(STUDIES, headers=member).json()] == [study["id"]]
    trials = client.get(f"{STUDIES}/s/trials", headers=member).json()
    assert trials["items"] == [] and trials["next_offset"] is None
    best = client.get(f"{STUDIES}/s/best", headers=member)
    assert best.status_code == 404 and "no complete trial" in best.json()["detail"]
    assert client.get(f"{STUDIES}/nope", headers=member).status_code == 404

    again = client.post(STUDIES, json=body(), headers=member)
    assert again.status_code == 409 and "already has a study" in again.json()["detail"]


def test_the_loop_s_trials_show_through_the_api(
    client: TestClient, auth: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    study = client.post(STUDIES, json=body(), headers=auth["member"]).json()
    assert study["baseline_version"] == 1, "the config the agent registered"
    assert (study["end_reason"], study["ended_at"], study["outcome_version"]) == ("", None, None)
    loop_pass(runtime, study["id"])
    # The first trial measures the job's pre-study config, which it already runs.
    [trial] = client.get(f"{STUDIES}/s/trials", headers=auth["agent"]).json()["items"]
    assert trial["state"] == "running" and trial["desired_version"] == 1 and trial["baseline"]
    assert trial["params"] == START_CONFIG
    config = client.get(f"{JOBS}/train/config", headers=auth["agent"]).json()
    assert config["desired"]["version"] == 1
    assert config["desired"]["config"] == trial["params"]
    assert config["desired"]["source"] == "agent"


PROMQL: dict[str, Any] = {"objective": "promql", "direction": "maximize"}
BAD_STUDIES: list[tuple[dict[str, Any], str]] = [
    ({"space": {**SPACE, "batch_size": [64, 8]}}, "batch_size: inverted bounds, low 64 > high 8"),
    ({"space": {**SPACE, "batch_size": [33, 63]}}, "contain no power of two"),
    ({"space": {**SPACE, "sync_period": [4, 1]}}, "sync_period: inverted bounds"),
    ({"objective": "speed"}, "unknown objective 'speed'"),
    ({"strategy": "annealing"}, "unknown strategy 'annealing'"),
    ({"strategy_options": {"temperature": 1}}, "has no option temperature"),
    ({"measurement": {"window": 3}}, "unknown measurement option window"),
    ({"measurement": {"min_samples": 2}}, "min_samples must be >= 4"),
    ({"measurement": {"warmup_s": 10, "window_s": 30, "budget_s": 20}}, "measurement.budget_s"),
    ({"space": {"batch_size": [8, 64], "lr_scaling": None}}, "goodput needs base_batch"),
    ({"objective": "slo_throughput"}, "slo_throughput needs slo_s"),
    ({"space": {**SPACE, "batch_size": [64, 128]}}, "space.batch_size: the job runs batch_size=32"),
    ({**PROMQL, "objective_expr": "sum(rate(x{job=$job}[1m]"}, "objective_expr: parse error"),
    ({**PROMQL, "objective_expr": "x{job=$job}[1m]"}, "objective_expr: "),
    ({**PROMQL, "objective_expr": "predict_linear(x[5m], 1)"}, "predict_linear() is not supported"),
    ({**PROMQL, "direction": None, "objective_expr": "up"}, "promql needs a direction"),
    (PROMQL, "promql needs objective_expr"),
    ({"objective_expr": "up"}, "objective_expr is for the promql objective, not goodput"),
    ({"space": {"lr_scaling": None}}, "the space needs batch_size, or knobs the job declared"),
    ({"space": {"knobs": ["max_delay_ms"]}}, "the job declared no knob 'max_delay_ms'"),
    # Without batch_size no learning-rate rule: a training field would be ignored.
    ({"space": {"sync_period": [1, 2]}}, "space.sync_period needs space.batch_size"),
    (
        {"space": {"power_limit_w": [300, 700], "base_lr": 0.1, "lr_scaling": "sqrt"}},
        "space.base_lr, space.lr_scaling need space.batch_size",
    ),
]


def test_bad_studies_are_refused_with_the_reason(
    client: TestClient, auth: dict[str, dict[str, str]]
) -> None:
    for overrides, reason in BAD_STUDIES:
        answer = client.post(STUDIES, json=body(**overrides), headers=auth["member"])
        assert answer.status_code == 422, (overrides, answer.text)
        assert reason in answer.json()["detail"], (overrides, answer.json())
    assert client.get(STUDIES, headers=auth["member"]).json() == [], "nothing half-created"


def test_a_space_of_a_service_s_own_knobs(
    client: TestClient, auth: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    """No batch_size and no learning rate: an inference server's batching knobs by name."""
    member = auth["member"]
    assert client.post(JOBS, json={"name": "serve", "kind": "inference"}, headers=member).is_success
    with session_scope(runtime.sessions) as session:
        project = accounts.get_project_by_name(session, "alpha")
        assert project is not None
        project_id = project.id
    jobsim.write_steps(
        runtime.engine,
        project_id,
        "serve",
        start=utcnow() - timedelta(seconds=30),
        end=utcnow(),
        per_rank=100.0,
        ranks=1,
    )
    knobs = {"max_batch_size": 8, "max_delay_ms": 5}
    declared: list[dict[str, Any]] = [
        {"name": "max_batch_size", "type": "int", "low": 1, "high": 64, "powers_of_two": True},
        {"name": "max_delay_ms", "type": "int", "low": 1, "high": 64, "log": True},
    ]
    declared = [{**d, "default": knobs[d["name"]]} for d in declared]
    agent = {**AGENT, "world_size": 1, "ranks": [{"rank": 0, "gpu_uuids": []}], "config": knobs}
    # A declaration the tuner could not search is refused when the agent registers.
    bad = [{**declared[1], "low": 0}]
    refused = client.post(
        f"{JOBS}/serve/agents", json={**agent, "knobs": bad}, headers=auth["agent"]
    )
    assert refused.status_code == 422, refused.text
    assert "max_delay_ms: log scale needs low >= 1" in refused.json()["detail"]
    agent["knobs"] = declared
    assert client.post(f"{JOBS}/serve/agents", json=agent, headers=auth["agent"]).is_success
    # A person's config outside a declared range is refused naming it.
    released = client.put(
        f"{JOBS}/serve/config",
        json={"config": {"max_batch_size": 6, "max_delay_ms": 5}},
        headers=member,
    )
    assert released.status_code == 422, released.text
    assert "max_batch_size=6 is outside [1, 64] (powers of two)" in released.json()["detail"]
    created = client.post(
        f"{JOBS}/serve/studies",
        json={"name": "batching", "space": {"knobs": list(knobs)}, "slo_s": 0.1},
        headers=member,
    )
    assert created.status_code == 201, created.text
    study = created.json()
    assert study["objective"] == "slo_throughput", "the default for an inference service"
    params = study["space"]["params"]
    assert [p["name"] for p in params] == ["max_batch_size", "max_delay_ms"]
    assert params[0]["powers_of_two"] and params[1]["log"], "searched as the service declared"
    assert study["space"]["lr_scaling"] is None
    loop_pass(runtime, study["id"])
    [trial] = client.get(f"{JOBS}/serve/studies/batching/trials", headers=member).json()["items"]
    assert trial["params"] == knobs, "the first trial measures what the service runs"


def test_a_promql_objective(
    client: TestClient, auth: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    # Step timings are not required: the expression names the series it reads.
    expr = "sum(rate(tl_tokens_total{job=$job}[1m]))"
    created = client.post(
        f"{JOBS}/silent/studies",
        json=body(objective="promql", objective_expr=expr, direction="minimize", driven_by="agent"),
        headers=auth["member"],
    )
    assert created.status_code == 201, created.text
    study = created.json()
    assert (study["objective"], study["direction"]) == ("promql", "minimize")
    assert study["options"]["objective_expr"] == expr


def test_a_job_without_step_timing_data_is_refused(
    client: TestClient, auth: dict[str, dict[str, str]]
) -> None:
    answer = client.post(f"{JOBS}/silent/studies", json=body(), headers=auth["member"])
    assert answer.status_code == 422
    assert "has no step-timing data" in answer.json()["detail"]


def test_scoping_and_roles(client: TestClient, auth: dict[str, dict[str, str]]) -> None:
    assert client.post(STUDIES, json=body(), headers=auth["member"]).status_code == 201
    refused = client.post(STUDIES, json=body(name="t"), headers=auth["agent"])
    assert refused.status_code == 403
    for path in (STUDIES, f"{STUDIES}/s", f"{STUDIES}/s/trials", f"{STUDIES}/s/best"):
        assert client.get(path, headers=auth["stranger"]).status_code == 404
        assert client.get(path).status_code == 401
    stranger_post = client.post(STUDIES, json=body(name="x"), headers=auth["stranger"])
    assert stranger_post.status_code == 404
    assert client.post(f"{STUDIES}/s/ask", headers=auth["stranger"]).status_code == 404


def test_an_agent_drives_its_own_trials(
    client: TestClient, auth: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    member, agent = auth["member"], auth["agent"]
    created = client.post(STUDIES, json=body(driven_by="agent", strategy="random"), headers=member)
    assert created.status_code == 201
    asked = client.post(f"{STUDIES}/s/ask", json={"context": {"load": 0.5}}, headers=agent)
    assert asked.status_code == 201, asked.text
    trial = asked.json()
    assert trial["number"] == 1 and trial["state"] == "running"
    assert trial["desired_version"] is None, "the agent applies it itself"
    assert "learning_rate" in trial["params"]

    tell = f"{STUDIES}/s/trials/1/tell"
    result = {"state": "complete", "value": 812.0, "stderr": 9.5, "measurements": {"n": 40}}
    told = client.post(tell, json=result, headers=agent)
    assert told.status_code == 200, told.text
    assert told.json()["value"] == 812.0 and told.json()["measurements"] == {"n": 40}
    assert client.post(tell, json=result, headers=agent).status_code == 200, "idempotent"
    conflict = client.post(tell, json={**result, "value": 1.0}, headers=agent)
    assert conflict.status_code == 409

    best = client.get(f"{STUDIES}/s/best", headers=agent).json()
    assert best["number"] == 1 and best["params"] == trial["params"]

    client.post(f"{STUDIES}/s/ask", headers=agent)
    oom = client.post(
        f"{STUDIES}/s/trials/2/tell", json={"state": "infeasible", "reason": "oom"}, headers=agent
    )
    assert oom.status_code == 200 and oom.json()["reason"] == "oom"
    no_reason = client.post(f"{STUDIES}/s/trials/2/tell", json={"state": "failed"}, headers=agent)
    assert no_reason.status_code == 422 and "needs a reason" in no_reason.json()["detail"]
    other = {"state": "failed", "reason": "x"}
    assert client.post(f"{STUDIES}/s/trials/2/tell", json=other, headers=agent).status_code == 409
    bad_value = client.post(
        f"{STUDIES}/s/trials/9/tell", json={"state": "failed", "value": 3.0}, headers=agent
    )
    assert bad_value.status_code == 422 and "has no value" in bad_value.json()["detail"]
    unknown = client.post(
        f"{STUDIES}/s/trials/9/tell", json={"state": "failed", "reason": "x"}, headers=agent
    )
    assert unknown.status_code == 404

    with session_scope(runtime.sessions) as session:
        entries = session.scalars(
            select(AuditEntry).where(AuditEntry.action.in_(("trial.ask", "trial.tell")))
        ).all()
        assert entries and all(e.actor.endswith(":node-7") for e in entries)


def test_ask_and_tell_are_for_agent_driven_studies(
    client: TestClient, auth: dict[str, dict[str, str]]
) -> None:
    client.post(STUDIES, json=body(), headers=auth["member"])
    asked = client.post(f"{STUDIES}/s/ask", headers=auth["agent"])
    assert asked.status_code == 409 and "driven by the tuner loop" in asked.json()["detail"]
    told = client.post(
        f"{STUDIES}/s/trials/1/tell", json={"state": "failed", "reason": "x"}, headers=auth["agent"]
    )
    assert told.status_code == 409


def test_stop_and_resume(
    client: TestClient, auth: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    study = client.post(STUDIES, json=body(), headers=auth["member"]).json()
    loop_pass(runtime, study["id"])
    assert (
        client.patch(f"{STUDIES}/s", json={"state": "stopped"}, headers=auth["agent"]).status_code
        == 403
    )
    stopped = client.patch(f"{STUDIES}/s", json={"state": "stopped"}, headers=auth["member"])
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    [trial] = client.get(f"{STUDIES}/s/trials", headers=auth["member"]).json()["items"]
    assert (trial["state"], trial["reason"]) == ("failed", "study stopped")
    assert loop_pass(runtime, study["id"]).detail == "study is stopped"
    resumed = client.patch(f"{STUDIES}/s", json={"state": "running"}, headers=auth["member"])
    assert resumed.json()["state"] == "running"
    assert loop_pass(runtime, study["id"]).trial == 2
    bad = client.patch(f"{STUDIES}/s", json={"state": "complete"}, headers=auth["member"])
    assert bad.status_code == 422


def test_the_memory_bound_option(client: TestClient, auth: dict[str, dict[str, str]]) -> None:
    member = auth["member"]
    default = client.post(STUDIES, json=body(), headers=member).json()
    assert default["options"]["memory"] == {"enabled": True, "headroom": 0.1}
    tuned = client.post(
        STUDIES, json=body(name="t", memory={"headroom": 0.25}), headers=member
    ).json()
    assert tuned["options"]["memory"] == {"enabled": True, "headroom": 0.25}
    off = client.post(STUDIES, json=body(name="u", memory={"enabled": False}), headers=member)
    assert off.status_code == 201 and off.json()["options"]["memory"]["enabled"] is False
    for memory, field in (
        ({"headroom": 1.0}, "headroom"),
        ({"headroom": -0.1}, "headroom"),
        ({"headroom": "lots"}, "headroom"),
        ({"head_room": 0.1}, "head_room"),
    ):
        answer = client.post(STUDIES, json=body(name="v", memory=memory), headers=member)
        assert answer.status_code == 422, (memory, answer.text)
        assert [field] == answer.json()["detail"][0]["loc"][-1:], answer.json()
    assert [s["name"] for s in client.get(STUDIES, headers=member).json()] == ["s", "t", "u"]


def test_a_study_of_a_job_no_agent_serves_is_refused(
    client: TestClient, auth: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    answer = client.post(f"{JOBS}/unserved/studies", json=body(), headers=auth["member"])
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith("job 'unserved' has no agent: start the job with")
    # An agent that registered long ago and has not polled since is not serving it either.
    client.post(f"{JOBS}/unserved/agents", json=AGENT, headers=auth["agent"])
    with session_scope(runtime.sessions) as session:
        for agent in session.scalars(select(JobAgent)):
            agent.last_seen_at = utcnow() - timedelta(hours=1)
    silent = client.post(f"{JOBS}/unserved/studies", json=body(), headers=auth["member"])
    assert silent.status_code == 422
    assert "more than ack_timeout_s (300 s)" in silent.json()["detail"]
    # A job whose agent drives its own study needs no loop to serve it.
    driven = client.post(
        f"{JOBS}/unserved/studies", json=body(driven_by="agent"), headers=auth["member"]
    )
    assert driven.status_code == 201 and driven.json()["baseline_version"] is None


def test_cancel(client: TestClient, auth: dict[str, dict[str, str]], runtime: Runtime) -> None:
    member = auth["member"]
    study = client.post(STUDIES, json=body(), headers=member).json()
    loop_pass(runtime, study["id"])
    assert client.delete(f"{STUDIES}/s", headers=auth["agent"]).status_code == 403
    cancelled = client.delete(f"{STUDIES}/s", headers=member)
    assert cancelled.status_code == 200, cancelled.text
    out = cancelled.json()
    assert out["state"] == "cancelled" and out["ended_at"] is not None
    assert out["end_reason"].startswith("cancelled by token:") and ":alice;" in out["end_reason"]
    assert "the job stays on its pre-study config" in out["end_reason"]
    again = client.delete(f"{STUDIES}/{study['id']}", headers=member)
    assert again.status_code == 200 and again.json() == out, "a second cancel changes nothing"
    [trial] = client.get(f"{STUDIES}/s/trials", headers=member).json()["items"]
    assert (trial["state"], trial["reason"]) == ("failed", "study cancelled")
    resumed = client.patch(f"{STUDIES}/s", json={"state": "running"}, headers=member)
    assert resumed.status_code == 409 and "is cancelled" in resumed.json()["detail"]
    assert client.delete(f"{STUDIES}/nope", headers=member).status_code == 404


def test_an_ended_study_cannot_be_cancelled(
    client: TestClient, auth: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    study = client.post(STUDIES, json=body(), headers=auth["member"]).json()
    with session_scope(runtime.sessions) as session:
        job = session.get_one(Job, study["job_id"])
        job.status = "succeeded"
    assert loop_pass(runtime, study["id"]).action == "ended"
    ended = client.get(f"{STUDIES}/s", headers=auth["member"]).json()
    assert ended["state"] == "failed" and ended["end_reason"].startswith("the job is succeeded")
    refused = client.delete(f"{STUDIES}/s", headers=auth["member"])
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith("study 's' has already ended failed: the job is")


def test_an_energy_study_over_the_power_limit(
    client: TestClient, auth: dict[str, dict[str, str]]
) -> None:
    member = auth["member"]
    space = {**SPACE, "power_limit_w": [300, 700]}
    created = client.post(
        STUDIES,
        json=body(
            objective="samples_per_joule", space=space, throughput_floor=350, driven_by="agent"
        ),
        headers=member,
    )
    assert created.status_code == 201, created.text
    study = created.json()
    assert study["options"]["throughput_floor"] == 350.0
    [power] = [p for p in study["space"]["params"] if p["name"] == "power_limit_w"]
    assert (power["low"], power["high"]) == (300, 700)
    refusals: tuple[tuple[dict[str, Any], str], ...] = (
        # The loop measures the job's config first: it must say what limit the job runs at
        # (its agent registers it when it sets the knob).
        ({}, "space.power_limit_w: the job's config (desired version 1) has no power_limit_w"),
        ({"objective": "throughput"}, "throughput_floor is for the samples_per_joule"),
    )
    for overrides, reason in refusals:
        answer = client.post(
            STUDIES,
            json=body(
                name="x",
                space=space,
                throughput_floor=350,
                **{"objective": "samples_per_joule", **overrides},
            ),
            headers=member,
        )
        assert answer.status_code == 422, answer.text
        assert reason in answer.json()["detail"], answer.json()
