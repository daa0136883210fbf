"""The issue's crash test: ``kill -9`` of a real ``tuneloop up`` under OTLP load, restarted on
the same data directory, several times; every sample answered 200 is stored in the end (on
SQLite and on PostgreSQL). Replay is at least once, so duplicates are counted and reported, not
failed on."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric
from sqlalchemy import create_engine, text

from tests.conftest import BACKENDS
from tests.helpers import free_port
from tests.otlp.builders import metrics_request, number

_TOKEN = re.compile(r"^\s*token\s+(tl_\S+)")
KILLS = 5
SENDERS = 4
POINTS_PER_REQUEST = 50
METRIC = "crash_load"
STRIDE = 10_000_000  # a sender's values are sender * STRIDE + sequence: unique over the run


class Server:
    """``tuneloop up`` as a child process; started again on the same data dir after a kill."""

    def __init__(self, database_url: str, data_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")},
            "TUNELOOP_DATA_DIR": str(data_dir),
            "TUNELOOP_DATABASE_URL": database_url,
            "TUNELOOP_SOURCES": "host",
        }
        self.token: str | None = None
        self.output: list[str] = []
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "tuneloop", "up", "--port", str(self.port)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.process = process
        assert process.stdout is not None
        for line in process.stdout:
            self.output.append(line)
            if match := _TOKEN.match(line):
                self.token = match.group(1)
            if "Press Ctrl-C" in line:
                break
        threading.Thread(
            target=lambda: self.output.extend(process.stdout or ()), daemon=True
        ).start()
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{self.base}/healthz", timeout=1)
                return
            except httpx.TransportError:
                assert process.poll() is None, "".join(self.output)
                assert time.monotonic() < deadline, "".join(self.output)
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        self.process.wait(30)
        assert self.process.returncode == 0, "".join(self.output)


@dataclass
class Sender:
    """Sends requests of distinct samples until the server goes away; keeps what got a 200."""

    number: int
    base: str
    token: str
    sequence: int = 0
    acknowledged: set[float] = field(default_factory=set)
    refused: int = 0

    def run(self) -> None:
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/x-protobuf",
        }
        start_ns = (time.time_ns() // 1_000_000 - 3_600_000) * 1_000_000
        with httpx.Client(timeout=10) as client:
            while True:
                values = [
                    float(self.number * STRIDE + self.sequence + i)
                    for i in range(POINTS_PER_REQUEST)
                ]
                points = [
                    number(value, start_ns + int(value % STRIDE) * 1_000_000) for value in values
                ]
                self.sequence += POINTS_PER_REQUEST
                body = metrics_request(
                    [Metric(name=METRIC, gauge=Gauge(data_points=points))],
                    resource={"service.name": f"sender-{self.number}"},
                ).SerializeToString()
                try:
                    response = client.post(f"{self.base}/v1/metrics", content=body, headers=headers)
                except httpx.TransportError:
                    return  # killed: whatever was in flight was never acknowledged
                if response.status_code == 200:
                    self.acknowledged.update(values)
                else:
                    self.refused += 1


def stored_values(database_url: str) -> list[float]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT samples.value FROM samples JOIN series"
                    " ON series.id = samples.series_id WHERE series.metric = :metric"
                ),
                {"metric": METRIC},
            ).scalars()
            return [float(value) for value in rows]
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_database_url", BACKENDS, indirect=True)
def test_kill_9_under_load_loses_no_acknowledged_sample(
    empty_database_url: str, tmp_path: Path
) -> None:
    server = Server(empty_database_url, tmp_path / "data")
    senders: list[Sender] = []
    rng = random.Random(15)
    for _ in range(KILLS):
        server.start()
        assert server.token is not None, "".join(server.output)
        round_senders = [
            Sender(number, server.base, server.token, sequence=_next_sequence(senders, number))
            for number in range(SENDERS)
        ]
        threads = [threading.Thread(target=sender.run) for sender in round_senders]
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(1.0, 2.0))
        server.kill()
        for thread in threads:
            thread.join(15)
        senders.extend(round_senders)
    server.start()  # replays what the last crash left in the log
    acknowledged = set().union(*(sender.acknowledged for sender in senders))
    deadline = time.monotonic() + 20
    while not acknowledged <= set(stored_values(empty_database_url)):
        if time.monotonic() > deadline:
            break  # counted and reported below
        time.sleep(0.2)
    server.stop()
    stored = stored_values(empty_database_url)
    lost = acknowledged - set(stored)
    duplicates = len(stored) - len(set(stored))
    print(
        f"\n{KILLS} kills: {len(acknowledged)} samples acknowledged, {len(lost)} lost,"
        f" {duplicates} stored twice, {sum(s.refused for s in senders)} requests refused"
    )
    assert len(acknowledged) > KILLS * SENDERS * POINTS_PER_REQUEST
    assert not lost, f"{len(lost)} acknowledged samples lost"


def _next_sequence(senders: list[Sender], number: int) -> int:
    """Where sender ``number`` goes on: after everything it (or its predecessors) sent."""
    return max((s.sequence for s in senders if s.number == number), default=0)
