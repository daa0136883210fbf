"""Real peers from Debian's packages, started by the tests on loopback ports of their own: a
Prometheus server (optionally with its remote-write receiver), a single-node VictoriaMetrics
and an Alertmanager. ``.ci/ensure-tools`` installs them; a missing binary fails under CI=true
and skips elsewhere (``tests.helpers.missing``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import free_port, missing


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        missing(f"{name} not found (.ci/ensure-tools installs it)")
    return found


@contextmanager
def _serving(
    command: Sequence[str], url: str, ready_path: str, log_path: Path, what: str
) -> Iterator[str]:
    """Run ``command`` until the block ends; yield ``url`` once ``ready_path`` answers 200."""
    log = log_path.open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"{what} exited:\n{log_path.read_text()[-4000:]}"
            try:
                with urllib.request.urlopen(url + ready_path, timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{what} did not become ready"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


@contextmanager
def running_prometheus(
    config: dict[str, Any],
    workdir: Path,
    *,
    remote_write_receiver: bool = False,
    data_dir: Path | None = None,
    extra_flags: Sequence[str] = (),
) -> Iterator[str]:
    """A Prometheus server on a loopback port with ``config`` (and its remote-write receiver
    at ``/api/v1/write`` if asked); its base URL. ``data_dir`` may hold blocks made beforehand
    (``promtool tsdb create-blocks-from``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    command = [
        binary("prometheus"),
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={data_dir or workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        *(["--web.enable-remote-write-receiver"] if remote_write_receiver else []),
        *extra_flags,
    ]
    with _serving(
        command, f"http://127.0.0.1:{port}", "/-/ready", workdir / "prometheus.log", "prometheus"
    ) as url:
        yield url


@contextmanager
def running_victoria_metrics(
    workdir: Path, *, extra_flags: Sequence[str] = (), port: int | None = None
) -> Iterator[str]:
    """A single-node VictoriaMetrics on a loopback port (``port``, else a free one); its base
    URL (remote write at ``/api/v1/write``, the Prometheus query API at ``/api/v1/...``).
    Samples are searchable at once (no latency offset) so tests can read back what they
    wrote."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port if port is not None else free_port()
    command = [
        binary("victoria-metrics"),
        f"-storageDataPath={workdir / 'vmdata'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",
        "-search.latencyOffset=0s",
        "-search.disableCache",
        "-loggerLevel=WARN",
        *extra_flags,
    ]
    with _serving(
        command, f"http://127.0.0.1:{port}", "/health", workdir / "vm.log", "victoria-metrics"
    ) as url:
        yield url


@contextmanager
def running_alertmanager(
    config: dict[str, Any], workdir: Path, *, extra_flags: Sequence[str] = ()
) -> Iterator[str]:
    """An Alertmanager on a loopback port with ``config``, clustering off; its base URL (the
    API at ``/api/v2/...``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))
    command = [
        binary("alertmanager"),
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        # A lone peer: no gossip port of its own to collide with another test's.
        "--cluster.listen-address=",
        "--log.level=warn",
        *extra_flags,
    ]
    with _serving(
        command, f"http://127.0.0.1:{port}", "/-/ready", workdir / "am.log", "alertmanager"
    ) as url:
        yield url


def alertmanager_alerts(url: str, **filters: str) -> list[dict[str, Any]]:
    """``GET /api/v2/alerts``: the alerts Alertmanager holds (``filter``, ``active``,
    ``silenced``, ``inhibited`` as its query parameters)."""
    query = urllib.parse.urlencode(filters)
    with urllib.request.urlopen(f"{url}/api/v2/alerts?{query}", timeout=30) as response:
        found: list[dict[str, Any]] = json.load(response)
    return found


def flush_victoria_metrics(url: str) -> None:
    """Make VictoriaMetrics' buffered samples searchable now (a debug endpoint of its own)."""
    with urllib.request.urlopen(url + "/internal/force_flush", timeout=10) as response:
        assert response.status == 200


def prom_api(url: str, path: str, params: dict[str, str] | None = None) -> Any:
    """``data`` of a successful Prometheus HTTP API answer (``path`` like ``/api/v1/query``)."""
    query = urllib.parse.urlencode(params or {})
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=30) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]
