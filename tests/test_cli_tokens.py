"""``tuneloop token`` and ``tuneloop project`` on a real SQLite file; the minted secret is then
used against the real API app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

import tuneloop.cli.tokens  # registers the commands
import tuneloop.settings
from api.main import create_app
from tests.helpers import cli_runner, sqlite_file
from tuneloop.cli import app
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings, get_settings


@pytest.fixture
def database_file(tmp_path: Path) -> str:
    return sqlite_file(tmp_path)


@pytest.fixture
def cli(database_file: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    with cli_runner(database_file, monkeypatch) as runner:
        yield runner


def run(cli: CliRunner, *args: str) -> Result:
    return cli.invoke(app, list(args))


@pytest.fixture
def api(database_file: str) -> Iterator[TestClient]:
    runtime = Runtime.open(Settings(database_url=database_file, redis_url=None))
    try:
        with TestClient(create_app(runtime)) as client:
            yield client
    finally:
        runtime.close()


def test_token_create_prints_only_a_secret_that_authenticates(
    cli: CliRunner, api: TestClient
) -> None:
    assert run(cli, "project", "create", "demo").exit_code == 0
    result = run(cli, "token", "create", "--project", "demo", "--role", "agent", "--name", "ci")
    assert result.exit_code == 0, result.output
    secret = result.stdout.strip()
    assert result.stdout == secret + "\n"
    assert secret.startswith("tl_")
    assert "shown only once" in result.stderr
    assert secret not in result.stderr

    me = api.get("/api/v1/tokens/self", headers={"Authorization": f"Bearer {secret}"})
    assert me.status_code == 200
    assert (me.json()["name"], me.json()["role"]) == ("ci", "agent")
    jobs = api.get("/api/v1/projects/demo/jobs", headers={"Authorization": f"Bearer {secret}"})
    assert jobs.status_code == 200

    listed = run(cli, "token", "list", "--project", "demo")
    assert listed.exit_code == 0
    assert secret[:11] in listed.stdout
    assert secret not in listed.stdout
    assert "active" in listed.stdout

    revoked = run(cli, "token", "revoke", str(me.json()["id"]))
    assert revoked.exit_code == 0, revoked.output
    after = api.get("/api/v1/tokens/self", headers={"Authorization": f"Bearer {secret}"})
    assert after.status_code == 401
    assert "revoked" in run(cli, "token", "list").stdout


def test_admin_token_reaches_every_project(cli: CliRunner, api: TestClient) -> None:
    run(cli, "project", "create", "one")
    result = run(cli, "token", "create", "--role", "admin")
    assert result.exit_code == 0, result.output
    headers = {"Authorization": f"Bearer {result.stdout.strip()}"}
    created = api.post("/api/v1/projects", json={"name": "two"}, headers=headers)
    assert created.status_code == 201
    names = [p["name"] for p in api.get("/api/v1/projects", headers=headers).json()["items"]]
    assert names == ["one", "two"]
    listed = run(cli, "project", "list")
    assert listed.exit_code == 0
    assert "one" in listed.stdout
    assert "two" in listed.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("token", "create", "--project", "demo", "--role", "admin"), 2, "leave out --project"),
        (("token", "create", "--role", "member"), 2, "needs --project"),
        (("token", "create", "--project", "demo", "--role", "root"), 2, "invalid role"),
        (("token", "create", "--project", "missing"), 1, "does not exist"),
        (("token", "create", "--project", "demo", "--name", "a\tb"), 1, "invalid token name"),
        (("token", "list", "--project", "missing"), 1, "does not exist"),
        (("token", "revoke", "424242"), 1, "not found"),
        (("project", "create", "demo"), 1, "already exists"),
        (("project", "create", "Bad Name'; DROP TABLE projects;--"), 1, "invalid project name"),
    ],
)
def test_errors_are_one_line_on_stderr(
    cli: CliRunner, args: tuple[str, ...], code: int, message: str
) -> None:
    assert run(cli, "project", "create", "demo").exit_code == 0
    result = run(cli, *args)
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert result.stderr.startswith("tuneloop: ")
    assert result.stdout == ""
    assert "Traceback" not in result.output
    # Nothing was half-written: still exactly one project.
    assert len(run(cli, "project", "list").stdout.strip().splitlines()) == 2


def test_missing_schema_is_reported_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tuneloop.settings, "_current", None)
    get_settings.cache_clear()
    runner = CliRunner(env={"TUNELOOP_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"})
    result = runner.invoke(app, ["project", "list"])
    monkeypatch.undo()
    get_settings.cache_clear()
    assert result.exit_code == 2
    assert "database error" in result.stderr
    assert "Traceback" not in result.output
