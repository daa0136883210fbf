"""The diagnosis on real jobs: each verdict's job (tuneloop/demo/verdict_jobs.py), a real 2-rank
PyTorch DDP job with the agent, runs under a real ``tuneloop up``; each gets its verdict through
the API within a minute of steady running (its first diagnosis with data), the rank slowed on
purpose is named as the straggler, each verdict stays right for the next 30 s, and a job with
no step timings gets ``no_data``. The four jobs run at the same time against one control
plane."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tuneloop.demo import verdict_jobs
from tuneloop.demo.processes import ControlPlane, RunningJob, check_response, control_plane
from tuneloop.demo.verdict_jobs import JOBS, VerdictJob, Watch

WINDOW = "30s"
STEADY_TO_RIGHT_S = 60.0
HOLD_S = 30.0
"""Once right, each verdict is read again for this long: it must stay right."""


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane(tmp_path_factory.mktemp("plane"), say=lambda _: None) as started:
        yield started


@pytest.fixture(scope="module")
def watched(
    plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Watch]]:
    workdir = tmp_path_factory.mktemp("jobs")
    running: dict[str, tuple[VerdictJob, RunningJob]] = {}
    try:
        for job in JOBS.values():
            name = verdict_jobs.job_name(job)
            running[name] = (job, verdict_jobs.start(plane, job, workdir / "data", workdir / name))
        watches = verdict_jobs.watch(plane, running, window=WINDOW, timeout_s=STEADY_TO_RIGHT_S)
        held = time.monotonic() + HOLD_S
        while time.monotonic() < held:
            time.sleep(3)
            for name, (job, job_run) in running.items():
                job_run.check_alive()
                found = verdict_jobs.diagnosis(plane, name, WINDOW)
                if not verdict_jobs.is_right(job, found):
                    watches[name].wrong.append(found)
        yield watches
    finally:
        for _, job_run in running.values():
            job_run.kill()


def _seen(watched: dict[str, Watch], kind: str) -> Watch:
    return watched[verdict_jobs.job_name(JOBS[kind])]


@pytest.mark.parametrize("kind", ["input", "comm", "compute", "straggler"])
def test_each_job_gets_its_verdict_within_a_minute_of_steady_running(
    watched: dict[str, Watch], kind: str
) -> None:
    seen = _seen(watched, kind)
    assert seen.first_data_s is not None, f"no step timings reached the diagnosis: {seen.last}"
    took = seen.steady_to_right_s
    assert took is not None and took <= STEADY_TO_RIGHT_S, (
        f"{kind}: want {seen.job.verdict}, last answer {seen.last}"
    )
    assert seen.wrong == [], "the verdict did not stay right"


def test_the_slowed_rank_is_named_as_the_straggler(watched: dict[str, Watch]) -> None:
    seen = _seen(watched, "straggler")
    assert seen.right_s is not None and seen.last is not None, seen.last
    [lagging] = seen.last["stragglers"]
    assert lagging["rank"] == verdict_jobs.SLOW_RANK
    assert lagging["metric"] == "forward"  # where the sleep is; the other rank waits in grad_sync
    # A CPU job's ranks register no GPU, and the host is stored per registered GPU: the rank
    # alone names it (on a GPU job, host and GPU come too: tests/tuner/test_diagnosis_reading.py).
    assert lagging["gpus"] == []
    assert lagging["seconds"] > lagging["others_median"] + 0.02  # 40 ms slower per forward


def test_a_job_with_no_step_timings_gets_no_data(plane: ControlPlane) -> None:
    with plane.client() as client:
        response = client.post(plane.jobs_url, json={"name": "quiet", "status": "running"})
        check_response(response, "register the job")
    found = verdict_jobs.diagnosis(plane, "quiet", WINDOW)
    assert found["verdict"] == "no_data"
    assert found["shares"] == [] and found["stragglers"] == [] and found["ranks"] == 0
