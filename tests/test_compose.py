"""docker-compose.yml stays in step with the CLI and the repository (no Docker needed)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from tests.helpers import promtool
from tuneloop.cli import _register_commands, app
from tuneloop.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS_CONFIG = ROOT / "dashboards/prometheus/prometheus.yml"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def tuneloop_commands() -> list[tuple[str, list[str]]]:
    return [
        (name, command_of(service))
        for name, service in SERVICES.items()
        if command_of(service)[:1] == ["tuneloop"]
    ]


def host_mounts() -> list[tuple[str, str, str]]:
    """(service, host path, container path) of every bind mount."""
    mounts = []
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                mounts.append((name, source, target))
    return mounts


def test_every_part_of_the_control_plane_is_a_service() -> None:
    assert set(SERVICES) >= {
        "postgres",
        "redis",
        "migrate",
        "api",
        "worker",
        "beat",
        "collector",
        "prometheus",
        "grafana",
    }
    assert {name for name, _ in tuneloop_commands()} == {
        "migrate",
        "api",
        "worker",
        "beat",
        "collector",
    }


@pytest.mark.parametrize(("service", "command"), tuneloop_commands())
def test_each_command_is_a_tuneloop_subcommand(service: str, command: list[str]) -> None:
    _register_commands()
    # Typer bundles its own click: tell groups by their ``commands``, not by class.
    group: Any = typer.main.get_command(app)
    walked = ["tuneloop"]
    for word in command[1:]:
        if word.startswith("-") or not hasattr(group, "commands"):
            break
        assert word in group.commands, f"{service}: `{' '.join(walked)}` has no command {word!r}"
        group = group.commands[word]
        walked.append(word)
    assert len(walked) > 1, f"{service}: no subcommand in {command}"
    assert not hasattr(group, "commands"), f"{service}: `{' '.join(walked)}` is a group"


@pytest.mark.parametrize(("service", "source", "target"), host_mounts())
def test_every_mounted_host_path_exists(service: str, source: str, target: str) -> None:
    assert (ROOT / source).resolve().exists(), f"{service} mounts missing {source} at {target}"


def test_named_volumes_are_declared() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} uses undeclared volume {source}"


def test_dependencies_exist_and_their_conditions_can_be_met() -> None:
    for name, service in SERVICES.items():
        for dependency, spec in (service.get("depends_on") or {}).items():
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
            condition = spec["condition"]
            assert condition in CONDITIONS
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dependency], f"{dependency} has no healthcheck"
            if condition == "service_completed_successfully":
                assert SERVICES[dependency].get("restart") == "no", f"{dependency} must run once"


def test_long_running_servers_have_healthchecks() -> None:
    for name in ("postgres", "redis", "api", "worker", "prometheus", "grafana"):
        assert SERVICES[name]["healthcheck"]["test"], name


def test_tuneloop_services_use_known_settings_and_the_image() -> None:
    known = {ENV_PREFIX + field.upper() for field in Settings.model_fields}
    for name, _ in tuneloop_commands():
        service = SERVICES[name]
        assert service["build"] == "."
        unknown = set(service["environment"]) - known
        assert not unknown, f"{name} sets unknown settings {unknown}"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    assert "pip install /src" in dockerfile


def served_ports(service: dict[str, Any]) -> set[int]:
    """The ports other containers can reach ``service`` on, as far as the file tells: the
    container side of ``ports`` and ``expose``, and for a tuneloop process listening beyond
    loopback (TUNELOOP_HOST 0.0.0.0), its TUNELOOP_PORT (API) and ``--metrics-port``."""
    ports = {int(str(entry).split("/")[0].split(":")[-1]) for entry in service.get("ports", [])}
    ports |= {int(str(entry).split("/")[0]) for entry in service.get("expose", [])}
    environment = service.get("environment") or {}
    if command_of(service)[:1] == ["tuneloop"] and environment.get("TUNELOOP_HOST") == "0.0.0.0":
        if "TUNELOOP_PORT" in environment:
            ports.add(int(environment["TUNELOOP_PORT"]))
        command = command_of(service)
        if "--metrics-port" in command:
            ports.add(int(command[command.index("--metrics-port") + 1]))
    return ports


def test_prometheus_scrapes_services_and_ports_that_exist() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"tuneloop-api", "tuneloop-collector"} <= set(jobs)
    scraped = set()
    for name, job in jobs.items():
        assert job.get("metrics_path", "/metrics") == "/metrics", name
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, _, port = target.partition(":")
                assert host in SERVICES, f"{name} scrapes {target}: no service {host!r}"
                served = served_ports(SERVICES[host])
                assert int(port) in served, f"{name} scrapes {target}; {host} serves {served}"
                scraped.add(host)
    assert {"api", "collector"} <= scraped
    assert "prometheus" in SERVICES and "./dashboards/prometheus/prometheus.yml" in {
        source for service, source, _ in host_mounts() if service == "prometheus"
    }


def test_prometheus_config_passes_promtool() -> None:
    result = subprocess.run(
        [promtool(), "check", "config", str(PROMETHEUS_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_grafana_provisioning() -> None:
    provisioning = ROOT / "dashboards/provisioning"
    datasources = yaml.safe_load((provisioning / "datasources/tuneloop.yml").read_text())
    by_name = {source["name"]: source for source in datasources["datasources"]}
    assert by_name["tuneloop"]["type"] == "grafana-postgresql-datasource"
    assert by_name["tuneloop"]["url"] == "postgres:5432"
    assert by_name["tuneloop"]["jsonData"]["database"] == "tuneloop"
    assert by_name["prometheus"]["type"] == "prometheus"
    assert by_name["prometheus"]["url"] == "http://prometheus:9090"
    # The tsdb profile's VictoriaMetrics, at the URL the tuneloop services are given there.
    assert by_name["victoriametrics"]["type"] == "prometheus"
    assert by_name["victoriametrics"]["url"] == TSDB_URL

    dashboards = yaml.safe_load((provisioning / "dashboards/tuneloop.yml").read_text())
    (provider,) = dashboards["providers"]
    mounted = {target for service, _, target in host_mounts() if service == "grafana"}
    assert provider["options"]["path"] in mounted


TSDB_URL = "http://victoriametrics:8428"
TSDB_UP = f"TUNELOOP_TSDB_URL={TSDB_URL} docker compose --profile tsdb up --build"


def test_the_tsdb_profile_adds_victoria_metrics_and_only_it() -> None:
    profiled = {name for name, service in SERVICES.items() if service.get("profiles")}
    assert profiled == {"victoriametrics"}  # a plain `docker compose up` is unchanged
    vm = SERVICES["victoriametrics"]
    assert vm["profiles"] == ["tsdb"]
    assert vm["image"].startswith("victoriametrics/victoria-metrics:")
    assert "http://127.0.0.1:8428/health" in vm["healthcheck"]["test"]
    assert any(volume.endswith(":/storage") for volume in vm["volumes"])
    assert "-storageDataPath=/storage" in command_of(vm)


def test_tuneloop_services_take_the_tsdb_url_from_the_environment() -> None:
    for name, _ in tuneloop_commands():
        environment = SERVICES[name]["environment"]
        # Unset: empty, series in PostgreSQL; the profile's command sets it.
        assert environment["TUNELOOP_TSDB_URL"] == "${TUNELOOP_TSDB_URL:-}", name
    settings = Settings(tsdb_url=TSDB_URL)
    host, _, port = settings.tsdb_url.removeprefix("http://").partition(":")
    assert int(port) in served_ports(SERVICES[host])
    assert TSDB_UP in (ROOT / "docker-compose.yml").read_text()
    assert TSDB_UP in (ROOT / "docs/deploy-on-your-tsdb.md").read_text()
