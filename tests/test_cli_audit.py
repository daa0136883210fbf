"""A change made through the command line is audited exactly once, as ``cli``, by the domain
function that makes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select
from typer.testing import CliRunner

from tests.helpers import cli_runner, sqlite_file
from tuneloop.cli import app
from tuneloop.storage.models import AuditEntry

RULES = """
rules:
  - name: GpuHot
    kind: threshold
    query: {metric: DCGM_FI_DEV_GPU_TEMP, aggregation: max, window: 5m}
    op: ">"
    threshold: 85
inhibit_rules:
  - source: ['alertname="GpuHot"']
    target: ['alertname="GpuWarm"']
"""


@pytest.fixture
def database_file(tmp_path: Path) -> str:
    return sqlite_file(tmp_path)


@pytest.fixture
def cli(database_file: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    with cli_runner(database_file, monkeypatch) as runner:
        yield runner


def _audit(database_file: str) -> list[tuple[str, str]]:
    engine = create_engine(database_file)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                select(AuditEntry.action, AuditEntry.actor).order_by(AuditEntry.id)
            )
            return [(action, actor) for action, actor in rows]
    finally:
        engine.dispose()


def test_each_cli_change_writes_one_audit_entry(
    cli: CliRunner, database_file: str, tmp_path: Path
) -> None:
    assert cli.invoke(app, ["project", "create", "demo"]).exit_code == 0
    created = cli.invoke(app, ["token", "create", "--project", "demo", "--role", "agent"])
    assert created.exit_code == 0, created.output
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    loaded = cli.invoke(app, ["alerts", "load", "--project", "demo", str(rules)])
    assert loaded.exit_code == 0, loaded.output

    assert _audit(database_file) == [
        ("project.create", "cli"),
        ("token.create", "cli"),
        ("alert.rules.load", "cli"),
    ]
