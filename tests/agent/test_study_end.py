"""A tuning study's end seen by the job: a real agent against a live API on each backend, the
tuning loop's passes run here. Whether the study is cancelled, or the job stops acknowledging
and comes back, the agent ends up running the config it ran before the study (a study with
nothing better to show: ``test_study_end_no_gain.py``)."""

from __future__ import annotations

import httpx

from tests.agent.conftest import Live
from tests.agent.study_job import (
    JOB,
    START,
    create_study,
    desired_configs,
    has_steps,
    passes_until,
    running_job,
    study,
    trial_states,
    until,
)
from tuneloop.job_configs import study_outcome_source


def test_a_cancelled_study_puts_the_job_back_on_its_config(live: Live) -> None:
    with running_job(live) as agent:
        until(lambda: agent.version == 1, 10, "the starting config to be adopted")
        until(lambda: has_steps(live), 10, "step timings in the store")
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
    [outcome] = [r for r in desired_configs(live) if r[0] == 3]
    assert outcome == (3, START, study_outcome_source(created["id"]))


def test_a_job_that_stops_acknowledging_fails_the_study_and_restarts_on_its_config(
    live: Live,
) -> None:
    with running_job(live) as agent:
        until(lambda: agent.version == 1, 10, "the starting config to be adopted")
        until(lambda: has_steps(live), 10, "step timings in the store")
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
