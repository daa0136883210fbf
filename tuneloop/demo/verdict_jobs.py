"""One training job per verdict of the job diagnosis (docs/diagnosis.md), each the demo's real
2-rank DDP job (:mod:`tuneloop.demo.job`, ``tune`` mode) with its emulation knobs set so that
one thing bounds its steps:

- ``input``: a slow input pipeline (``--input-delay-ms``): steps wait for their data.
- ``comm``: a slow all-reduce (``--sync-latency-ms``): steps wait for gradient synchronisation.
- ``compute``: no emulated delay, the character-level GRU (``charlm``, the heaviest workload)
  on large micro-batches accumulated over 8 micro-steps, so that forward and backward dominate
  and only one backward in 8 all-reduces.
- ``straggler``: rank 1 sleeps in each forward pass (``--slow-rank-ms``); rank 0 waits for it
  in the all-reduce.

Shared by ``bench/diagnosis_jobs.py`` and the tests that check each job gets its verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tuneloop.demo import workloads
from tuneloop.demo.processes import ControlPlane, DemoError, RunningJob, check_response, start_job

SLOW_RANK: Final = "1"
DIGITS: Final = "digits"
CHARLM: Final = "charlm"


@dataclass(frozen=True)
class VerdictJob:
    name: str
    verdict: str
    """The verdict the diagnosis must give it."""
    args: tuple[str, ...]
    straggler: str | None = None
    """The rank the diagnosis must name as lagging."""
    workload: str = DIGITS


def _args(line: str) -> tuple[str, ...]:
    return tuple(line.split())


JOBS: Final = {
    job.name: job
    for job in (
        VerdictJob(
            "input",
            "input_bound",
            _args("--batch-size 8 --input-delay-ms 40 --sync-latency-ms 0"),
        ),
        VerdictJob(
            "comm",
            "communication_bound",
            _args("--batch-size 8 --input-delay-ms 0 --sync-latency-ms 40"),
        ),
        VerdictJob(
            "compute",
            "compute_bound",
            _args("--batch-size 64 --sync-period 8 --input-delay-ms 0 --sync-latency-ms 0"),
            workload=CHARLM,
        ),
        VerdictJob(
            "straggler",
            "communication_bound",
            _args("--batch-size 8 --input-delay-ms 2 --sync-latency-ms 0")
            + _args(f"--slow-rank {SLOW_RANK} --slow-rank-ms 40"),
            straggler=SLOW_RANK,
        ),
    )
}
"""The straggler's verdict is communication-bound: its fast rank spends the slow rank's extra
forward time waiting in the all-reduce, and the verdict averages the ranks."""


def job_name(job: VerdictJob) -> str:
    return f"{job.name}-bound" if job.name != "straggler" else "straggler"


def data_file(workload: str, directory: Path) -> Path:
    """The workload's data set (seed 0) in ``directory``, written once."""
    path = directory / f"{workload}.npz"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        workloads.get(workload).save_data(path, 0)
    return path


def start(plane: ControlPlane, job: VerdictJob, data_dir: Path, out_dir: Path) -> RunningJob:
    """Register the job as a running training job and start both ranks; they train until
    ``out_dir/stop`` exists. Its data set is written into ``data_dir`` if not there yet."""
    name = job_name(job)
    data = data_file(job.workload, data_dir)
    args = [*job.args, "--workload", job.workload, "--stop-file", str(out_dir / "stop")]
    with plane.client() as client:
        response = client.post(plane.jobs_url, json={"name": name, "status": "running"})
        check_response(response, f"register job {name}")
    return start_job(plane, name, "tune", data, out_dir, args)


def stop(running: RunningJob, timeout_s: float = 60) -> None:
    (running.out_dir / "stop").touch()
    try:
        running.wait(timeout_s)
    finally:
        running.kill()


def diagnosis(plane: ControlPlane, name: str, window: str) -> dict[str, Any]:
    with plane.client() as client:
        response = client.get(f"{plane.jobs_url}/{name}/diagnosis", params={"window": window})
    check_response(response, f"diagnose {name}")
    found: dict[str, Any] = response.json()
    return found


def is_right(job: VerdictJob, found: dict[str, Any]) -> bool:
    """The diagnosis gives ``job`` its verdict and names (only) its slowed rank as lagging."""
    lagging = {s["rank"] for s in found["stragglers"]}
    expected = {job.straggler} if job.straggler is not None else set()
    return bool(found["verdict"] == job.verdict and lagging == expected)


@dataclass
class Watch:
    """How the diagnosis of one job went: the first answer with data, the first right one."""

    job: VerdictJob
    started: float
    first_data_s: float | None = None
    right_s: float | None = None
    last: dict[str, Any] | None = None
    wrong: list[dict[str, Any]] = field(default_factory=list)
    """Answers read after the first right one that were not right."""

    @property
    def steady_to_right_s(self) -> float | None:
        if self.first_data_s is None or self.right_s is None:
            return None
        return self.right_s - self.first_data_s


def watch(
    plane: ControlPlane,
    jobs: dict[str, tuple[VerdictJob, RunningJob]],
    *,
    window: str,
    timeout_s: float,
    settle_s: float = 0.0,
    interval_s: float = 2.0,
) -> dict[str, Watch]:
    """Poll every job's diagnosis until each has been right (after ``settle_s`` of data, so a
    verdict is not read off the first steps alone) or ``timeout_s`` passes since its first
    answer with data."""
    started = time.monotonic()
    watches = {name: Watch(job, started) for name, (job, _) in jobs.items()}
    while True:
        now = time.monotonic()
        for name, (job, running) in jobs.items():
            seen = watches[name]
            if seen.right_s is not None:
                continue
            running.check_alive()
            found = diagnosis(plane, name, window)
            now = time.monotonic()
            seen.last = found
            if found["verdict"] == "no_data":
                continue
            if seen.first_data_s is None:
                seen.first_data_s = now - started
            if now - started - seen.first_data_s >= settle_s and is_right(job, found):
                seen.right_s = now - started
        pending = [w for w in watches.values() if w.right_s is None]
        if not pending:
            return watches
        waited = [now - started - (w.first_data_s or 0.0) for w in pending]
        if all(w.first_data_s is not None for w in pending) and min(waited) > timeout_s:
            return watches
        if now - started > timeout_s + 120:  # no data at all for two minutes more
            return watches
        time.sleep(interval_s)


__all__ = ["JOBS", "DemoError", "VerdictJob", "Watch", "diagnosis", "start", "stop", "watch"]
