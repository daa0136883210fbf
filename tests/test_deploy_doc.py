"""docs/deploy-on-your-tsdb.md is true as written: every setting it names exists, every shell
block's settings load and reach the URLs it says, every ``tuneloop`` command is one, and its
Prometheus snippet passes promtool. (VictoriaMetrics single node end to end:
tests/timeseries_contract/test_whole_loop_on_vm.py; separate write and read URLs and the
headers: tests/timeseries_contract/test_tsdb_urls.py.)"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from tests.helpers import promtool
from tuneloop.cli import _register_commands, app
from tuneloop.settings import ENV_PREFIX, Settings, load_settings
from tuneloop.storage.timeseries.backends import open_remote_backend

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs/deploy-on-your-tsdb.md").read_text()
SETTING = re.compile(r"\bTUNELOOP_[A-Z0-9_]*[A-Z0-9]\b")


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.MULTILINE | re.DOTALL)


def exports(block: str) -> dict[str, str]:
    env = {}
    for line in block.splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            env[name] = value
    return env


def test_every_setting_named_exists() -> None:
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    named = set(SETTING.findall(DOC))
    assert {"TUNELOOP_TSDB_URL", "TUNELOOP_TSDB_WRITE_URL", "TUNELOOP_TSDB_HEADERS"} <= named
    assert named - known == set()


SHELL = [block for block in blocks("sh") if exports(block)]


@pytest.mark.parametrize("block", SHELL)
def test_each_set_up_loads_and_reaches_its_urls(
    block: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = exports(block)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    backend = open_remote_backend(settings)
    if "TUNELOOP_TSDB_URL" not in env:
        assert backend is None
        return
    assert backend is not None
    try:
        assert f"{backend.client.url}/api/v1/query" == f"{env['TUNELOOP_TSDB_URL']}/api/v1/query"
        write = env.get("TUNELOOP_TSDB_WRITE_URL", f"{env['TUNELOOP_TSDB_URL']}/api/v1/write")
        assert backend.writer.url == write
    finally:
        backend.close()


def test_the_set_ups_are_all_there() -> None:
    urls = {exports(block).get("TUNELOOP_TSDB_URL") for block in SHELL}
    assert {
        "http://victoriametrics:8428",
        "http://vmselect:8481/select/0/prometheus",
        "http://mimir-query-frontend:8080/prometheus",
        "http://thanos-query:10902",
    } <= urls
    assert any("TUNELOOP_REMOTE_WRITE_URL" in exports(block) for block in SHELL)


def test_every_tuneloop_command_is_one() -> None:
    _register_commands()
    commands = [
        shlex.split(line)
        for block in blocks("sh")
        for line in block.splitlines()
        if line.startswith("tuneloop ")
    ]
    assert ["tuneloop", "up"] in commands
    for words in commands:
        group: Any = typer.main.get_command(app)
        for word in words[1:]:
            if word.startswith("-"):
                assert word.split("=")[0] in {
                    option for param in group.params for option in param.opts
                }, words
            elif hasattr(group, "commands"):
                assert word in group.commands, words
                group = group.commands[word]


def test_the_prometheus_snippet_passes_promtool(tmp_path: Path) -> None:
    (snippet,) = [block for block in blocks("yaml") if "remote_write" in block]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}}) + snippet)
    result = subprocess.run(
        [promtool(), "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
