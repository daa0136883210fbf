"""``tuneloop study list`` and ``tuneloop study show`` on a real SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import cli_runner, sqlite_file
from tests.tuner import jobsim
from tuneloop.cli import app
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import Study
from tuner import service
from tuner.space import SearchSpace


@pytest.fixture
def database_file(tmp_path: Path) -> str:
    url = sqlite_file(tmp_path)
    engine = make_engine(url)
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session, project="vision", name="resnet")
        study = service.create_study(
            session,
            job,
            name="batch",
            objective="throughput",
            space=SearchSpace.training((8, 64), lr_scaling=None),
            strategy="grid",
        )
        first = service.ask(session, study)
        service.tell(session, study, first.number, state="complete", value=812.5)
        second = service.ask(session, study)
        service.tell(session, study, second.number, state="infeasible", reason="oom")
    engine.dispose()
    return url


@pytest.fixture
def cli(database_file: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    with cli_runner(database_file, monkeypatch) as runner:
        yield runner


def test_study_list_and_show(cli: CliRunner) -> None:
    listed = cli.invoke(app, ["study", "list", "--project", "vision"])
    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.strip().splitlines()
    assert header.split() == [
        "ID",
        "PROJECT",
        "JOB",
        "NAME",
        "OBJECTIVE",
        "STRATEGY",
        "STATE",
        "TRIALS",
        "BEST",
    ]
    assert row.split() == [
        "1",
        "vision",
        "resnet",
        "batch",
        "throughput",
        "grid",
        "running",
        "2",
        "812.5",
    ]
    assert cli.invoke(app, ["study", "list", "--job", "other"]).stdout.strip().count("\n") == 0

    shown = cli.invoke(app, ["study", "show", "1"])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.strip().splitlines()
    assert lines[0] == "study 1 'batch': throughput (maximize), grid, running"
    assert "complete" in lines[2] and "batch_size=8" in lines[2] and "812.5" in lines[2]
    assert "infeasible" in lines[3] and lines[3].endswith("oom")
    assert lines[-1] == "best: trial 1, value 812.5: batch_size=8"

    missing = cli.invoke(app, ["study", "show", "99"])
    assert missing.exit_code == 1
    assert "study 99 does not exist" in missing.stderr


def test_study_cancel(cli: CliRunner, database_file: str) -> None:
    cancelled = cli.invoke(app, ["study", "cancel", "batch", "--job", "resnet"])
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.startswith(
        "study 1 'batch' cancelled: cancelled by cli; the job stays on its pre-study config"
    )
    again = cli.invoke(app, ["study", "cancel", "1"])
    assert again.exit_code == 0 and "was already cancelled" in again.stdout
    shown = cli.invoke(app, ["study", "show", "1"]).stdout.splitlines()
    assert shown[0].endswith(", cancelled")
    assert shown[1].startswith("cancelled: cancelled by cli;")

    engine = make_engine(database_file)
    with session_scope(session_factory(engine)) as session:
        study = session.get_one(Study, 1)
        study.state = "complete"
    engine.dispose()
    ended = cli.invoke(app, ["study", "cancel", "1"])
    assert ended.exit_code == 1 and "has already ended complete" in ended.stderr
    unnamed = cli.invoke(app, ["study", "cancel", "batch"])
    assert unnamed.exit_code == 2 and "give its id, or its job with --job" in unnamed.stderr
    missing = cli.invoke(app, ["study", "cancel", "batch", "--job", "other"])
    assert missing.exit_code == 1 and "does not exist" in missing.stderr
