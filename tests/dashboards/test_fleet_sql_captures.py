"""Every panel of the Fleet (SQL) dashboard, on a PostgreSQL store the collector's scrape source
filled from the real dcgm-exporter captures (tests/captures.py), shows exactly the hosts, GPUs
and MIG instances the captures hold, with the host variable at All and narrowed to one host.

Grafana's SQL boards read the store through PostgreSQL (the panels call migration 0005's
functions), so this runs there only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import Engine

from dashboards.grafana_sql import Variable
from tests.alerts.conftest import at
from tests.captures import PAGES, captured
from tests.dashboards.conftest import CAPTURES_END_S as END_S
from tests.dashboards.conftest import CAPTURES_PROJECT as PROJECT
from tests.dashboards.test_panels import BOARDS, run

pytestmark = pytest.mark.postgres

BOARD = BOARDS["fleet"]
_METRIC = re.compile(r"tuneloop_series\(\$\{project:sqlstring\}, '([A-Za-z_:0-9]+)'")
_SUFFIX = re.compile(r"\|\| ' (\w+)' AS metric")


def device(labels: dict[str, str]) -> str:
    """A GPU's line as the board names it: host, GPU and, for a MIG instance, its profile and
    instance id."""
    name = f"{labels['Hostname']} gpu {labels['gpu']}"
    if "GPU_I_PROFILE" in labels:
        name += f" {labels['GPU_I_PROFILE']} {labels['GPU_I_ID']}"
    return name


def expected(sql: str, hosts: list[str]) -> set[str]:
    (metric,) = _METRIC.findall(sql)
    suffix = _SUFFIX.search(sql)
    if metric.startswith("node_"):
        return set()  # the captures are GPU pages: no host's network or disks
    return {
        device(labels) + (f" {suffix.group(1)}" if suffix else "")
        for labels in captured(metric, hosts)
    }


def shown(captures_store: Engine, **chosen: Any) -> dict[tuple[str, str], set[str]]:
    """(panel title, refId) -> the names of the lines the panel draws."""
    answers = {}
    for panel in BOARD["panels"]:
        for target in panel["targets"]:
            _, rows = run(
                captures_store,
                target["rawSql"],
                start=at(0),
                end=at(END_S),
                interval_ms=60_000,
                **chosen,
            )
            answers[(panel["title"], target["refId"])] = {row[1] for row in rows}
    return answers


def variable(captures_store: Engine, name: str, **chosen: Any) -> list[str]:
    (found,) = [v for v in BOARD["templating"]["list"] if v["name"] == name]
    _, rows = run(captures_store, found["query"], start=at(0), end=at(END_S), **chosen)
    return [row[0] for row in rows]


def choose(captures_store: Engine, hosts: list[str]) -> dict[str, Any]:
    """The variables as Grafana sets them: the project, ``hosts``, and All of the GPUs the
    ``gpu`` variable lists for them."""

    chosen = {
        "project": Variable(PROJECT),
        "host": Variable(hosts, multi=True, include_all=True),
    }
    gpus = variable(captures_store, "gpu", **chosen)
    return {**chosen, "gpu": Variable(gpus, multi=True, include_all=True)}


def check(captures_store: Engine, hosts: list[str]) -> dict[tuple[str, str], set[str]]:
    answers = shown(captures_store, **choose(captures_store, hosts))
    for panel in BOARD["panels"]:
        for target in panel["targets"]:
            want = expected(target["rawSql"], hosts)
            assert answers[(panel["title"], target["refId"])] == want, (
                panel["title"],
                target["refId"],
            )
    return answers


def test_every_panel_shows_the_captured_gpus_with_every_host(captures_store: Engine) -> None:

    hosts = variable(captures_store, "host", project=Variable(PROJECT))
    assert hosts == sorted(PAGES)
    answers = check(captures_store, hosts)
    memory = answers[("GPU memory used", "A")]
    assert {
        "msxf-hpc-64-35-ai gpu 0 2g.20gb 3",
        "msxf-hpc-64-35-ai gpu 0 2g.20gb 5",
        "msxf-hpc-64-35-ai gpu 0 2g.20gb 6",
        "gpu-node-42 gpu 3 3g.40gb 1",
        "gpu-node-42 gpu 3 1g.10gb 9",
        "gpu-node-17 gpu 7 4g.40gb 1",
        "gpu-node-17 gpu 7 3g.40gb 2",
        "lke529760-766837-0a634ab30000 gpu 0",
    } <= memory
    assert {name.split(" gpu ")[0] for name in memory} == set(PAGES)
    # MIG instances report no utilization of their own.
    assert not any(name.count(" ") > 2 for name in answers[("GPU utilization", "A")])
    assert answers[("Last XID error code", "A")] >= {"gpu-node-42 gpu 1", "gpu-node-17 gpu 2"}


@pytest.mark.parametrize("host", sorted(PAGES))
def test_narrowing_to_one_host_shows_its_gpus_only(captures_store: Engine, host: str) -> None:
    answers = check(captures_store, [host])
    assert answers[("GPU memory used", "A")], f"{host} shows no GPU"


def test_the_gpu_variable_lists_the_captured_gpus(captures_store: Engine) -> None:

    chosen = {"project": Variable(PROJECT)}
    for host in PAGES:
        gpus = variable(
            captures_store, "gpu", host=Variable([host], multi=True, include_all=True), **chosen
        )
        want = {labels["gpu"] for labels in captured("DCGM_FI_DEV_FB_USED", [host])}
        assert sorted(gpus) == sorted(want), host
