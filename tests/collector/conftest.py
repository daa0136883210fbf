"""Fixtures of the collector tests: a project to write into, and a private PostgreSQL server
that a test may stop and start (never the shared one on 5432: other tests use it).

The private server needs PostgreSQL's server binaries (``initdb``, ``pg_ctl``; found through
``TUNELOOP_TEST_PG_BIN``, ``pg_config --bindir`` or ``/usr/lib/postgresql/*/bin``). Without
them the test fails under ``CI=true`` and is skipped elsewhere, with the reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert

from tests.helpers import free_port, missing
from tuneloop.storage.models import Project
from tuneloop.storage.types import utcnow


def create_project(engine: Engine, name: str = "p", max_series: int | None = None) -> int:
    with engine.begin() as connection:
        return int(
            connection.execute(
                insert(Project.__table__)  # type: ignore[arg-type]
                .values(name=name, max_series=max_series, created_at=utcnow())
                .returning(Project.__table__.c.id)  # type: ignore[attr-defined]
            ).scalar_one()
        )


@pytest.fixture
def project_id(engine: Engine) -> int:
    return create_project(engine)


def postgres_bindir() -> Path | None:
    candidates = [os.environ.get("TUNELOOP_TEST_PG_BIN", "")]
    pg_config = shutil.which("pg_config")
    if pg_config:
        result = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(result.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


@dataclass
class PrivatePostgres:
    """A PostgreSQL server of one test, in a temporary directory, on a free port."""

    bindir: Path
    directory: Path
    port: int

    @property
    def datadir(self) -> Path:
        return self.directory / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def initdb(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory} "
            # Durability of the server is not under test; speed is welcome.
            "-c fsync=off"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-l",
            str(self.directory / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "30", "stop")

    def log(self) -> str:
        path = self.directory / "server.log"
        return path.read_text() if path.exists() else ""

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bindir / program), *args]
        if os.geteuid() == 0:
            # initdb and postgres refuse to run as root.
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({result.returncode}): {result.stderr.strip()}\n{self.log()}"
            )


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL server (trust auth, user and database ``postgres``)."""
    bindir = postgres_bindir()
    if bindir is None:
        missing("PostgreSQL server binaries (initdb, pg_ctl) not found; set TUNELOOP_TEST_PG_BIN")
    # Not pytest's tmp_path: its parent is private to root and the server runs as postgres.
    directory = Path(tempfile.mkdtemp(prefix="tuneloop-pg-"))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    server = PrivatePostgres(bindir, directory, free_port())
    try:
        server.initdb()
        server.start()
        yield server
    finally:
        with contextlib.suppress(RuntimeError):  # already stopped
            server.stop("immediate")
        shutil.rmtree(directory, ignore_errors=True)
