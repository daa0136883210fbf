"""``tuneloop collect`` as a real process: its metrics port, a bad relabel config, and two of
them at once against one PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, func, select, text

from tests.conftest import reset_postgres
from tests.helpers import free_port
from tuneloop.storage.models import Series, samples


def tuneloop(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuneloop", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def environment(tmp_path: Path, database_url: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")}
    env["TUNELOOP_DATA_DIR"] = str(tmp_path / "data")
    if database_url:
        env["TUNELOOP_DATABASE_URL"] = database_url
    return env


def prepare(env: dict[str, str]) -> None:
    for command in (["db", "upgrade"], ["project", "create", "default"]):
        result = tuneloop(*command, env=env)
        assert result.returncode == 0, result.stdout + result.stderr


def written(port: int) -> float:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
    except httpx.TransportError:
        return 0.0
    for family in text_string_to_metric_families(response.text):
        if family.name == "tuneloop_collector_points_written":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def start_collect(env: dict[str, str], port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuneloop",
            "collect",
            "--interval",
            "0.2",
            "--metrics-port",
            str(port),
        ],
        env={**env, "TUNELOOP_FLUSH_INTERVAL_S": "0.1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "Traceback" not in output
    return output


def test_collect_writes_and_serves_its_metrics(tmp_path: Path) -> None:
    env = environment(tmp_path)
    prepare(env)
    port = free_port()
    process = start_collect(env, port)
    try:
        deadline = time.monotonic() + 15
        while written(port) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert written(port) > 0
    finally:
        output = stop(process)
    assert f"metrics    http://127.0.0.1:{port}/metrics" in output
    assert "collecting host every 0.2s" in output  # --interval applies to every source


def test_a_bad_relabel_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = environment(tmp_path)  # checked first thing: no schema or project needed
    rules = tmp_path / "rules.yaml"
    rules.write_text("- action: keep\n  regex: '(?=a)a'\n")
    result = tuneloop("collect", env={**env, "TUNELOOP_RELABEL_CONFIG": str(rules)})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "rule 1: invalid regex '(?=a)a': invalid perl operator: (?=" in result.stderr


def test_two_collectors_at_once_against_one_postgresql(
    tmp_path: Path, postgres_server_url: str
) -> None:
    reset_postgres(postgres_server_url)
    env = environment(tmp_path, postgres_server_url)
    prepare(env)
    ports = [free_port(), free_port()]
    # The same data directory on purpose: each process leases its own spool slot if needed.
    processes = [start_collect(env, port) for port in ports]
    try:
        deadline = time.monotonic() + 20
        while not all(written(port) > 0 for port in ports) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(written(port) > 0 for port in ports)
    finally:
        outputs = [stop(process) for process in processes]
    assert all("Traceback" not in output for output in outputs)
    engine = create_engine(postgres_server_url)
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(samples)).scalar_one() > 0
        # Both created the same series (same host) concurrently: each exists once.
        duplicated = connection.execute(
            text(
                "SELECT count(*) FROM (SELECT 1 FROM series GROUP BY metric, labels::text"
                " HAVING count(*) > 1) AS d"
            )
        ).scalar_one()
        assert duplicated == 0
        assert connection.execute(select(func.count()).select_from(Series)).scalar_one() > 0
    engine.dispose()
