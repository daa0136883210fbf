from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuneloop.settings import SettingsError, load_settings


def test_defaults_use_a_sqlite_file_in_the_data_dir(tmp_path: Path) -> None:
    settings = load_settings(data_dir=str(tmp_path))
    assert settings.resolved_database_url == f"sqlite:///{tmp_path / 'tuneloop.db'}"
    assert settings.redis_url is None


def test_postgres_urls_get_the_psycopg3_driver() -> None:
    settings = load_settings(database_url="postgresql://u@db:5432/tuneloop")
    assert settings.resolved_database_url == "postgresql+psycopg://u@db:5432/tuneloop"


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNELOOP_PORT", "9001")
    assert load_settings().port == 9001


def test_alert_receivers_reach_no_internal_network_unless_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().alerts_allowed_target_networks == ()
    monkeypatch.setenv("TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS", "10.20.0.0/16, fd00::/8")
    allowed = load_settings().alerts_allowed_target_networks
    assert [str(network) for network in allowed] == ["10.20.0.0/16", "fd00::/8"]
    monkeypatch.setenv("TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS", "10.20.0.1/16")
    with pytest.raises(SettingsError, match="TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS"):
        load_settings()


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNELOOP_PORT", "9001")
    assert load_settings(port=9002).port == 9002


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("TUNELOOP_PORT", "eighty", "invalid setting TUNELOOP_PORT:"),
        ("TUNELOOP_PORT", "70000", "invalid setting TUNELOOP_PORT:"),
        ("TUNELOOP_DATABASE_URL", "mysql://x", "invalid setting TUNELOOP_DATABASE_URL:"),
        ("TUNELOOP_LOG_LEVEL", "loud", "invalid setting TUNELOOP_LOG_LEVEL:"),
        ("TUNELOOP_CHUNK_MIN_SAMPLES", "0", "invalid setting TUNELOOP_CHUNK_MIN_SAMPLES:"),
        ("TUNELOOP_CHUNK_MIN_SAMPLES", "many", "invalid setting TUNELOOP_CHUNK_MIN_SAMPLES:"),
    ],
)
def test_invalid_environment_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert str(error.value).startswith(expected)
    assert "\n" not in str(error.value)


def test_invalid_flag_names_the_flag() -> None:
    with pytest.raises(SettingsError, match="invalid setting --port:"):
        load_settings(port=0)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuneloop", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_cli_stops_on_invalid_setting_with_one_line(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TUNELOOP_PORT": "eighty", "HOME": str(tmp_path)}
    result = run_cli("up", env=env)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("tuneloop: invalid setting TUNELOOP_PORT:")
    assert "Traceback" not in result.stderr


def test_cli_reports_a_database_that_is_down(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TUNELOOP_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/tuneloop",
    }
    result = run_cli("up", env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("tuneloop: cannot reach the database at")
    assert result.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(
    "url", ["postgresql//x", "sqlite://tmp/x.db", "postgresql://h:port/db", "postgres ql://x"]
)
def test_a_malformed_database_url_is_one_line_naming_the_forms(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("TUNELOOP_DATABASE_URL", url)
    with pytest.raises(SettingsError) as error:
        load_settings()
    message = str(error.value)
    assert message.startswith("invalid setting TUNELOOP_DATABASE_URL:")
    assert "sqlite:///relative/path.db" in message and "postgresql://" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///x.db", "sqlite:////tmp/x.db", "postgresql:///db"]
)
def test_well_formed_database_urls_pass(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("TUNELOOP_DATABASE_URL", url)
    assert load_settings().database_url == url


def test_cli_stops_on_a_malformed_database_url_with_one_line(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TUNELOOP_DATABASE_URL": "sqlite://tmp/x.db"}
    result = run_cli("db", "current", env={**env, "HOME": str(tmp_path)})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("tuneloop: invalid setting TUNELOOP_DATABASE_URL:")


def test_forwarding_is_configured_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TUNELOOP_REMOTE_WRITE_URL", "https://vm.example:8428/api/v1/write")
    monkeypatch.setenv("TUNELOOP_REMOTE_WRITE_HEADERS", '{"X-Scope-OrgID": "gpu-fleet"}')
    monkeypatch.setenv("TUNELOOP_REMOTE_WRITE_BEARER_TOKEN", "s3cret")
    settings = load_settings(data_dir=tmp_path)
    assert settings.remote_write_headers == {"X-Scope-OrgID": "gpu-fleet"}
    assert settings.remote_write_bearer_token is not None
    assert "s3cret" not in repr(settings)
    assert settings.resolved_remote_write_spool_dir == tmp_path / "spool" / "remote-write"
    monkeypatch.setenv("TUNELOOP_REMOTE_WRITE_URL", "vm.example:8428")
    with pytest.raises(SettingsError, match="TUNELOOP_REMOTE_WRITE_URL"):
        load_settings()
