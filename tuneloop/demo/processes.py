"""The control plane and the training job as child processes: ``tuneloop up`` on a fresh
SQLite store with a member and an agent token, and the 2 ranks of :mod:`tuneloop.demo.job` as
``torchrun`` would start them. Shared by the demo (:mod:`tuneloop.demo.runner`) and the
benchmarks that run the whole loop as a user does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tuneloop.ports import free_port

T = TypeVar("T")
Say = Callable[[str], None]

PROJECT = "demo"
WORLD_SIZE = 2


class DemoError(RuntimeError):
    """The demo could not go on; ``str()`` says why in one line."""


def until(probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.5) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


# --------------------------------------------------------------------------- control plane


@dataclass
class ControlPlane:
    url: str
    member_token: str
    agent_token: str
    process: subprocess.Popen[bytes]

    @property
    def jobs_url(self) -> str:
        return f"{self.url}/api/v1/projects/{PROJECT}/jobs"

    def client(self) -> httpx.Client:
        return httpx.Client(headers={"Authorization": f"Bearer {self.member_token}"}, timeout=30.0)


def _tokens(env: Mapping[str, str]) -> tuple[str, str]:
    """Migrate the store and create the demo project with a member and an agent token."""
    from tuneloop import accounts
    from tuneloop.runtime import Runtime
    from tuneloop.settings import Settings
    from tuneloop.storage import session_scope
    from tuneloop.storage.migrate import upgrade

    settings = Settings(
        data_dir=Path(env["TUNELOOP_DATA_DIR"]),
        database_url=env.get("TUNELOOP_DATABASE_URL", ""),
        redis_url=None,
    )
    upgrade(settings.resolved_database_url)
    runtime = Runtime.open(settings)
    try:
        with session_scope(runtime.sessions) as session:
            project, member = accounts.ensure_default_project(session, PROJECT)
            if member is None:
                raise DemoError(f"{settings.data_dir} already holds a demo; use an empty --dir")
            _, agent = accounts.create_token(session, project, "demo-job", "agent")
    finally:
        runtime.close()
    return member, agent


@contextmanager
def control_plane(
    workdir: Path, say: Say, settings: Mapping[str, str] | None = None
) -> Iterator[ControlPlane]:
    """``tuneloop up`` on a SQLite store in ``workdir``; ``settings`` (``TUNELOOP_*``) override
    the demo's own, e.g. a PostgreSQL database and a TSDB for the series."""
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")
    }  # the demo's own store and settings, whatever the shell has
    env.update(
        TUNELOOP_DATA_DIR=str(workdir / "store"),
        TUNELOOP_HOST="127.0.0.1",
        TUNELOOP_PORT=str(port),
        TUNELOOP_DEFAULT_PROJECT=PROJECT,
        TUNELOOP_SOURCES="host",
        TUNELOOP_TUNER_INTERVAL_S="0.5",
        TUNELOOP_ACTUATOR_INTERVAL_S="0.5",
        TUNELOOP_LOG_LEVEL="warning",
    )
    env.update(settings or {})
    member, agent = _tokens(env)
    log = (workdir / "control-plane.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tuneloop", "up"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            if process.poll() is not None:
                raise DemoError(f"the control plane exited ({process.returncode}); see {log.name}")
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        until(healthy, 60, "the control plane to answer /healthz")
        store = (
            "database of TUNELOOP_DATABASE_URL"
            if env.get("TUNELOOP_DATABASE_URL")
            else f"SQLite store in {workdir / 'store'}"
        )
        say(f"control plane up at {url} ({store})")
        yield ControlPlane(url, member, agent, process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


# --------------------------------------------------------------------------- the job


@dataclass
class RunningJob:
    processes: list[subprocess.Popen[bytes]]
    out_dir: Path

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise DemoError(
                    f"a rank of the job exited ({process.returncode}); "
                    f"see {self.out_dir / 'rank*.log'}"
                )

    def wait(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            try:
                process.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise DemoError(f"the job ran past {timeout_s:.0f} s; see {self.out_dir}") from None
        codes = [p.returncode for p in self.processes]
        if any(codes):
            raise DemoError(f"the job failed (exit codes {codes}); see {self.out_dir}/rank*.log")
        result: dict[str, Any] = json.loads((self.out_dir / "rank0.json").read_text())
        return result

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def start_job(
    plane: ControlPlane, job: str, mode: str, data: Path, out_dir: Path, args: Sequence[str]
) -> RunningJob:
    """Both ranks of the job, as torchrun would start them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WORLD_SIZE": str(WORLD_SIZE), "MASTER_ADDR": "127.0.0.1"}
    env.update(MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "tuneloop.demo.job",
        mode,
        plane.url,
        plane.agent_token,
        PROJECT,
        job,
        str(data),
        str(out_dir),
        *args,
    ]
    processes = []
    for rank in range(WORLD_SIZE):
        log = (out_dir / f"rank{rank}.log").open("wb")
        processes.append(
            subprocess.Popen(  # noqa: S603 - our own interpreter and module, no shell
                command, env={**env, "RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT
            )
        )
        log.close()
    return RunningJob(processes, out_dir)


def config_args(config: Mapping[str, int]) -> list[str]:
    return ["--batch-size", str(config["batch_size"]), "--sync-period", str(config["sync_period"])]


def check_response(response: httpx.Response, what: str) -> None:
    if response.status_code >= 400:
        raise DemoError(f"could not {what}: HTTP {response.status_code} {response.text[:300]}")


def create_study_when_ready(
    client: httpx.Client,
    job_url: str,
    body: Mapping[str, Any],
    job: RunningJob,
    *,
    timeout_s: float,
    interval_s: float,
) -> dict[str, Any]:
    """Create the study once the job's agent and first step timings are in the store (the API
    refuses it with 409/422 before); any other refusal ends the wait at once."""
    last: dict[str, str] = {}

    def create() -> dict[str, Any] | None:
        job.check_alive()
        response = client.post(f"{job_url}/studies", json=dict(body))
        if response.status_code == 201:
            created: dict[str, Any] = response.json()
            return created
        last["answer"] = response.text[:300]
        if response.status_code not in (409, 422):
            check_response(response, "create the study")
        return None

    try:
        return until(create, timeout_s, "the job's first step timings", interval_s=interval_s)
    except DemoError as exc:
        raise DemoError(f"{exc}; last answer: {last.get('answer')}") from None
