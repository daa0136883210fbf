"""``tuneloop alerts check`` and ``tuneloop alerts load`` on a real SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

import tuneloop.cli.alerts  # registers the commands
import tuneloop.settings
from tests.helpers import cli_runner, sqlite_file
from tuneloop import accounts
from tuneloop.cli import app
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import AlertInhibition, AlertRule

RULES = """
rules:
  - {name: Hot, kind: threshold, query: {metric: DCGM_FI_DEV_GPU_TEMP}, op: ">", threshold: 85}
"""


@pytest.fixture
def database_file(tmp_path: Path) -> Iterator[str]:
    url = sqlite_file(tmp_path)
    engine = make_engine(url)
    with session_scope(session_factory(engine)) as session:
        accounts.create_project(session, "default")
    engine.dispose()
    yield url


@pytest.fixture
def cli(database_file: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    with cli_runner(database_file, monkeypatch) as runner:
        yield runner


def test_check_and_load(cli: CliRunner, tmp_path: Path, database_file: str) -> None:
    assert tuneloop.cli.alerts.alerts_app is not None
    good = tmp_path / "rules.yaml"
    good.write_text(RULES)
    bad = tmp_path / "bad.yaml"
    bad.write_text(RULES.replace("threshold: 85", "threshold: 85, for: soon"))

    checked = cli.invoke(app, ["alerts", "check", str(good)])
    assert checked.exit_code == 0 and "1 rules, 0 inhibit rules" in checked.stdout
    refused = cli.invoke(app, ["alerts", "check", str(bad)])
    assert refused.exit_code == 1 and "rule Hot: for:" in refused.stderr

    loaded = cli.invoke(app, ["alerts", "load", str(good), "--pack"])
    assert loaded.exit_code == 0, loaded.stderr
    assert "1 created" in loaded.stdout and "21 created" in loaded.stdout
    again = cli.invoke(app, ["alerts", "load", "--pack"])
    assert "0 created, 0 updated, 21 unchanged, 0 deleted" in again.stdout
    failed = cli.invoke(app, ["alerts", "load", str(bad)])
    assert failed.exit_code == 1

    engine = make_engine(database_file)
    with engine.connect() as connection:
        names = set(connection.execute(select(AlertRule.name)).scalars())
        inhibitions = connection.execute(select(AlertInhibition.origin)).scalars().all()
    engine.dispose()
    assert {"Hot", "GpuXidError", "GpuNodeDown"} <= names and len(names) == 22
    assert inhibitions == ["pack:gpu-fleet"]


def test_load_links_runbooks_at_the_configured_base(cli: CliRunner, database_file: str) -> None:
    base = "https://git.example.com/ops/tuneloop/blob/main/docs/runbooks.md"
    loaded = cli.invoke(
        app, ["alerts", "load", "--pack"], env={"TUNELOOP_ALERTS_RUNBOOK_BASE_URL": base}
    )
    assert loaded.exit_code == 0, loaded.stderr
    engine = make_engine(database_file)
    with engine.connect() as connection:
        rows = connection.execute(select(AlertRule.name, AlertRule.annotations)).all()
    engine.dispose()
    assert len(rows) == 21
    assert all(annotations["runbook_url"] == f"{base}#{name.lower()}" for name, annotations in rows)
