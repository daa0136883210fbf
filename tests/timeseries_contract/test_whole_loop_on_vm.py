"""The whole loop with series in VictoriaMetrics and nothing but state in PostgreSQL.

A real ``tuneloop up`` child process on a PostgreSQL database with ``TUNELOOP_TSDB_URL`` at a
real VictoriaMetrics; the demo's real 2-rank DDP job sends its step timings over OTLP; a study
created through the API measures its trials from series read back from VictoriaMetrics; a
person's change is verified by the actuator from them; an alert rule fires on them; the
project's exposition shows them; cost says it cannot read them. Then
PostgreSQL's ``samples`` table is empty and VictoriaMetrics holds the job's series.

Quick measurement settings (2 trials of 2 s warm-up + 6 s window, a 5 s verification window,
alerts evaluated every second, the API polled 4 times a second): this checks the loop, not the
tuning."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import create_engine, text

from tests.peers import flush_victoria_metrics, prom_api, running_victoria_metrics
from tuneloop.demo.processes import (
    PROJECT,
    check_response,
    config_args,
    control_plane,
    create_study_when_ready,
    start_job,
)
from tuneloop.demo.runner import DemoPlan, study_body

T = TypeVar("T")
JOB = "digits"
PLAN = DemoPlan(trials=2, repeats=2, target_accuracy=0.9, tuned_run_s=3.0)
POLL_S = 0.25


def wait_for(probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s: {what}"
        time.sleep(POLL_S)


@pytest.mark.parametrize("empty_database_url", ["postgresql"], indirect=True)
def test_the_whole_loop_runs_on_victoria_metrics(empty_database_url: str, tmp_path: Path) -> None:
    from tuneloop.demo.job import save_digits

    data = tmp_path / "digits.npz"
    save_digits(data)
    with running_victoria_metrics(tmp_path / "vm") as vm:
        settings = {
            "TUNELOOP_DATABASE_URL": empty_database_url,
            "TUNELOOP_TSDB_URL": vm,
            "TUNELOOP_ALERTS_EVAL_INTERVAL_S": "1",
            "TUNELOOP_MAINTENANCE_INTERVAL_S": "2",
        }
        with control_plane(tmp_path, print, settings) as plane:
            client = plane.client()
            job_url = f"{plane.jobs_url}/{JOB}"
            alerts_url = f"{plane.url}/api/v1/projects/{PROJECT}/alerts"
            check_response(
                client.post(plane.jobs_url, json={"name": JOB, "status": "running"}),
                "create the job",
            )
            policy = {
                "bounds": {
                    "batch_size": {"min": PLAN.batch_size[0], "max": PLAN.batch_size[1]},
                    "sync_period": {"min": PLAN.sync_period[0], "max": PLAN.sync_period[1]},
                },
                "verify": {"settle_s": 1, "window_s": 5, "min_samples": 3},
            }
            check_response(client.put(f"{job_url}/actuator", json=policy), "set the policy")
            stop = tmp_path / "tune" / "stop"
            job = start_job(
                plane,
                JOB,
                "tune",
                data,
                tmp_path / "tune",
                [*config_args(PLAN.start), "--stop-file", str(stop), *PLAN.job_args()],
            )
            try:
                study = create_study_when_ready(
                    client, job_url, study_body(PLAN), job, timeout_s=180, interval_s=POLL_S
                )
                # Rules are checked against the metrics the TSDB holds: the job's are there now.
                rule = {
                    "name": "JobTraining",
                    "kind": "threshold",
                    "op": ">",
                    "threshold": 0,
                    "query": {"metric": "tuneloop_samples_per_second", "window": "1m"},
                }
                check_response(client.post(f"{alerts_url}/rules", json=rule), "create the rule")

                study_url = f"{job_url}/studies/{study['id']}"

                def study_done() -> dict[str, Any] | None:
                    job.check_alive()
                    found: dict[str, Any] = client.get(study_url).json()
                    assert found["state"] in ("running", "complete"), found
                    return found if found["state"] == "complete" else None

                done = wait_for(study_done, 300, "the study to complete")
                trials = client.get(f"{study_url}/trials", params={"limit": 50}).json()["items"]
                measured = [t for t in trials if t.get("value") is not None]
                assert measured, trials  # trials measured from series read from the TSDB

                # A person's change: the actuator measures a baseline and the window after
                # it from the TSDB, then confirms or rolls back (never "too few measurements").
                wait_for(
                    lambda: client.get(f"{job_url}/config").json()["in_sync"],
                    90,
                    "the job to run the study's outcome",
                )
                desired = client.get(f"{job_url}/config").json()["desired"]
                change = dict(desired["config"])
                change["batch_size"] = 16 if int(change["batch_size"]) != 16 else 32
                changed = client.put(f"{job_url}/config", json={"config": change})
                check_response(changed, "set a desired config")
                version = changed.json()["version"]

                def verdict() -> dict[str, Any] | None:
                    job.check_alive()
                    marks = client.get(f"{job_url}/config/marks", params={"verdict": "all"})
                    for mark in marks.json():
                        if mark["version"] == version:
                            return dict(mark)
                    return None

                mark = wait_for(verdict, 120, "the actuator's verdict on the change")
                assert mark["reason"] in ("verified", "objective_worse"), mark

                def firing() -> list[dict[str, Any]]:
                    alerts = client.get(alerts_url).json()
                    return [a for a in alerts if a["state"] == "firing"]

                fired = wait_for(firing, 60, "the alert rule to fire")
                assert {a["rule"] for a in fired} == {"JobTraining"}, fired

                # The project's exposition (what a Prometheus would scrape) reads the TSDB too.
                exposition = client.get(f"{plane.url}/api/v1/projects/{PROJECT}/metrics")
                assert exposition.status_code == 200, exposition.text
                assert "tuneloop_samples_per_second{" in exposition.text

                # Cost reads the store's samples and rollups: refused with a reason, not zero.
                cost = client.get(
                    f"{plane.url}/api/v1/projects/{PROJECT}/cost",
                    params={"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"},
                )
                assert cost.status_code == 409, cost.text
                assert cost.json()["code"] == "conflict"
                assert "TUNELOOP_TSDB_URL" in cost.json()["detail"]
            finally:
                stop.touch()
                job.wait(120)

        # State in PostgreSQL, series in VictoriaMetrics only.
        engine = create_engine(empty_database_url)
        try:
            with engine.connect() as connection:
                samples = connection.execute(text("SELECT count(*) FROM samples")).scalar_one()
                series = connection.execute(text("SELECT count(*) FROM series")).scalar_one()
                state = connection.execute(text("SELECT pg_database_size(current_database())"))
                print(f"PostgreSQL holds {state.scalar_one()} bytes of state")
                project_id = connection.execute(
                    text("SELECT id FROM projects WHERE name = :name"), {"name": PROJECT}
                ).scalar_one()
        finally:
            engine.dispose()
        assert (samples, series) == (0, 0)
        flush_victoria_metrics(vm)
        held = prom_api(
            vm,
            "/api/v1/series",
            {"match[]": f'{{tuneloop_project="{project_id}"}}', "start": "0"},
        )
        names = {series["__name__"] for series in held}
        assert {"tuneloop_samples_per_second", "tuneloop_step_duration_seconds"} <= names, names
    assert done["state"] == "complete"
