"""The job-side agent installs light. Its distribution (``agent/pyproject.toml``) is built as a
wheel and installed into a fresh virtual environment with PyTorch (the job's own) and numpy (the
demo job's own): none of the server's packages come with it, it installs no top-level module
but ``tuneloop``, ``tuneloop.agent`` and ``tuneloop.agent.torch`` import there, and the demo's
2-rank DistributedDataParallel job runs from it against a live control plane.

Slow by nature (two wheel builds, a virtual environment, PyTorch unpacked into it): the tests
are marked ``packaging`` and their names say what they build. pip installs the PyTorch of this
test environment, which it finds in its cache or its configured find-links.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

import tuneloop
import tuneloop.demo.job
from tests.agent.conftest import Live
from tests.agent.ddp import both_exit_cleanly, rank_results, stored_steps, two_ranks, until
from tuneloop.demo.job import BASE_BATCH, BASE_LR, LR_SCALING, save_digits
from tuner.space import SearchSpace

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
SERVER_PACKAGES = [
    "fastapi",
    "sqlalchemy",
    "celery",
    "kubernetes",
    "scikit-optimize",
    "psycopg",
    "psycopg-binary",
    "uvicorn",
    "alembic",
    "tuneloop",
]
"""Distributions a training job must not get with the agent (normalized names)."""
JOB = "light-digits"
CHANGE = {"batch_size": 32, "sync_period": 2}

# Run inside the agent's environment: what is installed, what the agent's wheel installed,
# and which tuneloop modules importing the agent and its PyTorch integration loads.
PROBE = """
import importlib.metadata as md, json, re, sys
import tuneloop.agent, tuneloop.agent.torch
record = md.distribution("tuneloop-agent").files or []
print(json.dumps({
    "installed": sorted({re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower()
                         for d in md.distributions()}),
    "top_level": sorted({str(f).split("/")[0] for f in record
                         if not str(f).split("/")[0].endswith(".dist-info")}),
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "tuneloop"),
    "version": tuneloop.__version__,
}))
"""


def _wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def _metadata(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode().splitlines()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The agent's and the server's wheels, built from this checkout."""
    out = tmp_path_factory.mktemp("wheels")
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out)]
    subprocess.run([*command, str(ROOT / "agent"), str(ROOT)], check=True, timeout=300)
    return {
        "agent": next(out.glob("tuneloop_agent-*.whl")),
        "server": next(out.glob("tuneloop-[0-9]*.whl")),
    }


@pytest.fixture(scope="module")
def agent_python(wheels: dict[str, Path]) -> Iterator[Path]:
    """A fresh virtual environment with the agent's wheel, PyTorch and numpy; removed after."""
    directory = Path(tempfile.mkdtemp(prefix="tuneloop-agent-venv-"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
        python = directory / "bin" / "python"
        torch = "torch==" + version("torch").split("+")[0]
        started = time.monotonic()
        # --no-compile: byte-compiling PyTorch's sources would take longer than unpacking it.
        pip = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-compile",
        ]
        subprocess.run([*pip, str(wheels["agent"]), torch, "numpy"], check=True, timeout=600)
        print(f"agent environment installed in {time.monotonic() - started:.0f} s")
        yield python
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_agent_and_server_wheels_share_no_file_and_one_version(wheels: dict[str, Path]) -> None:
    agent, server = _wheel_names(wheels["agent"]), _wheel_names(wheels["server"])
    assert agent & server == set()
    assert {name.split("/")[0] for name in agent} == {"tuneloop"}
    # Between them they ship every module of the package.
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tuneloop").rglob("*.py")}
    assert sources - agent - server == set()
    agent_version = next(line for line in _metadata(wheels["agent"]) if line.startswith("Version:"))
    assert agent_version == f"Version: {tuneloop.__version__}"
    pins = [
        line
        for line in _metadata(wheels["server"])
        if line.startswith("Requires-Dist: tuneloop-agent")
    ]
    assert pins == [f"Requires-Dist: tuneloop-agent=={tuneloop.__version__}"]


def test_agent_wheel_in_a_fresh_venv_installs_no_server_package(agent_python: Path) -> None:
    probe = subprocess.run(
        [str(agent_python), "-I", "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        cwd=agent_python.parent,
        timeout=120,
    )
    found = json.loads(probe.stdout)
    assert sorted(set(SERVER_PACKAGES) & set(found["installed"])) == []
    assert {"tuneloop-agent", "httpx", "opentelemetry-sdk", "torch"} <= set(found["installed"])
    assert found["top_level"] == ["tuneloop"]
    assert found["version"] == tuneloop.__version__
    # The agent imports nothing of the server (it is not there to import).
    allowed = re.compile(r"tuneloop(\.agent(\..+)?|\.learning_rate|\.backoff)?$")
    assert [m for m in found["loaded"] if not allowed.match(m)] == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_agent_wheel_in_a_fresh_venv_runs_a_two_rank_ddp_job(
    agent_python: Path, live: Live, tmp_path: Path
) -> None:
    member = httpx.Client(headers={"Authorization": f"Bearer {live.member_token}"})
    jobs = f"{live.url}/api/v1/projects/{live.project}/jobs"
    assert member.post(jobs, json={"name": JOB, "status": "running"}).status_code == 201

    def observed() -> int:
        state = member.get(f"{jobs}/{JOB}/config").json()
        return int(state["observed"]["version"]) if state["observed"] else 0

    # The demo's job and its workloads, copied out of the checkout as a user's own training
    # code: beside them it sees only the agent's environment (the copy joins the agent's
    # `tuneloop` package through its extend_path; nothing of the checkout is on the path).
    job_code = tmp_path / "job_code"
    demo = Path(tuneloop.demo.job.__file__).parent
    shutil.copytree(
        demo,
        job_code / "tuneloop" / "demo",
        ignore=shutil.ignore_patterns("__pycache__", "runner.py", "processes.py", "stats.py"),
    )
    train = job_code / "tuneloop" / "demo" / "job.py"
    stop, data = tmp_path / "stop", tmp_path / "digits.npz"
    save_digits(data)
    command = [str(agent_python), "-s", str(train), "tune", live.url, live.agent_token]
    command += [live.project, JOB, str(data), str(tmp_path), "--stop-file", str(stop)]
    command += ["--batch-size", "16", "--input-delay-ms", "2", "--sync-latency-ms", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(job_code))
    with two_ranks(command, env, cwd=tmp_path) as ranks_running:
        job = ranks_running[0]
        until(lambda: observed() == 1, 120, "the starting config was adopted", job)
        response = member.put(f"{jobs}/{JOB}/config", json={"config": CHANGE})
        assert response.status_code == 200, response.text
        until(lambda: observed() == 2, 60, "the change ran", job)
        # Step timings travel over OTLP from the agent's own OpenTelemetry SDK.
        for rank in ("0", "1"):
            until(lambda r=rank: len(stored_steps(live, r, JOB)) >= 4, 60, "step timings", job)  # type: ignore[misc]
        both_exit_cleanly(ranks_running, stop)
    member.close()

    ranks = rank_results(tmp_path)
    assert [version for version, _ in ranks[0]["history"]] == [2]
    # The rate the agent set is the one the tuner's rule gives the config on 2 ranks.
    space = SearchSpace.training(
        (1, 256), (1, 16), lr_scaling=LR_SCALING, base_lr=BASE_LR, base_batch=BASE_BATCH
    )
    expected = space.apply_lr_rule(CHANGE, ranks=2)
    for result in ranks:
        assert result["config"] == CHANGE
        assert result["learning_rate"] == pytest.approx(expected, rel=1e-9)
