"""dcgm-exporter's pages, scraped by the scrape source into the store, under the rule pack and
the cost figures: the real captures of tests/collector/fixtures (Kubernetes, MIG), the page in
the newer exporters' spelling (``hostname``) and one with ``Hostname``, MIG instances and XID
counters (fixtures/README.md says where each comes from).

A fleet of four hosts is scraped every 30 s for 26 minutes and the pack evaluated every minute;
the Kubernetes node stops answering after 20 minutes."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts import store
from alerts.rules import parse_rule_file
from collector.sources.dcgm_fields import DCGM_FP64_BLANK
from tests.alerts.conftest import Alerting, at
from tests.captures import PAGES, scraping, serving_pages
from tuneloop import cost
from tuneloop.storage import session_scope
from tuneloop.storage.models import AlertInstance, Series, samples

ROOT = Path(__file__).resolve().parents[2]
DOWN_HOST, DOWN_AFTER_S = "lke529760-766837-0a634ab30000", 1200
END_S = 1560
MIG_SLICES = {
    "gpu-node-42/3/GPU-71f6e0d9-2c84-4b5a-9e13-a08d5c2f7b91/3g.40gb/1",
    "gpu-node-42/3/GPU-71f6e0d9-2c84-4b5a-9e13-a08d5c2f7b91/1g.10gb/9",
    "gpu-node-17/7/GPU-6f1a3d98-b4e2-47c0-95a6-c83b0e2d7f49/4g.40gb/1",
    "gpu-node-17/7/GPU-6f1a3d98-b4e2-47c0-95a6-c83b0e2d7f49/3g.40gb/2",
}


@pytest.fixture
def exporters() -> Iterator[tuple[str, set[str]]]:
    with serving_pages() as served:
        yield served


def firing(alerting: Alerting) -> dict[tuple[tuple[str, str], ...], str]:
    """Labels -> summary of every alert firing now."""
    with alerting.sessions() as session:
        rows = session.scalars(select(AlertInstance).where(AlertInstance.state == "firing"))
        return {tuple(sorted(row.labels.items())): row.annotations["summary"] for row in rows}


def test_the_pack_and_cost_on_scraped_dcgm_exporter_pages(
    alerting: Alerting, exporters: tuple[str, set[str]]
) -> None:
    base, down = exporters
    pack = parse_rule_file((ROOT / "alerts/pack/gpu-fleet.yaml").read_text())
    with session_scope(alerting.sessions) as session:
        store.load_rule_file(session, alerting.project(session), pack, source="pack")
    seen: dict[tuple[tuple[str, str], ...], str] = {}
    with scraping(alerting.engine, alerting.project_id, base) as scraper:
        for t in range(0, END_S + 1, 30):
            if t >= DOWN_AFTER_S:
                down.add(DOWN_HOST)
            scraper.scrape(at(t))
            if t and t % 60 == 0:
                alerting.evaluate(t)
                seen.update(firing(alerting))

    # Every alert names its host, in its labels and in its text.
    fired = {dict(labels)["alertname"]: dict(labels) for labels in seen}
    for labels, summary in seen.items():
        host = dict(labels).get("Hostname")
        assert host in PAGES, labels
        assert host in summary, (labels, summary)
    assert set(fired) == {
        "GpuIdleWhileJobRuns",  # the Kubernetes capture: 0% busy while its pod holds it
        "GpuMigSliceIdleWhileJobRuns",
        "GpuXidErrors",
        "GpuXidError",  # gpu-node-17's exporter has no XID counter: its last-value gauge
        "GpuTemperatureHigh",
        "GpuFramebufferFullWhileIdle",
        "GpuNodeDown",
    }
    summaries = sorted(seen.values())
    assert "XID 48 on GPU 1 of gpu-node-42 (2 in dcgm-exporter's window)" in summaries
    assert "XID 13 on GPU 2 of gpu-node-17" in summaries
    assert "XID 94 on GPU 5 of gpu-node-17" in summaries
    assert "No GPU metrics from lke529760-766837-0a634ab30000 for over 3m" in summaries
    assert (
        "MIG slice 3g.40gb (instance 1) of GPU 3 on gpu-node-42 idle (1.208% active)"
        " while inference/embed-7d9f8c6b5-kq2xw holds it"
    ) in summaries
    # The counted XID speaks for gpu-node-42; its gauge's rule stays quiet there.
    assert not any(
        dict(labels)["alertname"] == "GpuXidError" and dict(labels)["Hostname"] == "gpu-node-42"
        for labels in seen
    )
    # The busy GPUs, whose framebuffer a training job's allocator holds, do not fire.
    assert {
        dict(labels)["gpu"]
        for labels in seen
        if dict(labels)["alertname"] == "GpuFramebufferFullWhileIdle"
    } == {"2"}

    usages = cost.gpu_usage(alerting.engine, alerting.project_id, at(0), at(END_S))
    by_gpu = {group.key: group for group in cost.summarize(usages, cost.GroupBy.GPU)}
    assert set(by_gpu) >= MIG_SLICES
    assert all(by_gpu[key].gpu_seconds > 0 for key in MIG_SLICES)
    namespaces = {group.key for group in cost.summarize(usages, cost.GroupBy.NAMESPACE)}
    assert namespaces == {"ml-training", "inference", "default", None}
    pods = {group.key for group in cost.summarize(usages, cost.GroupBy.POD)}
    assert {"embed-7d9f8c6b5-kq2xw", "cuda-75454ffb9f-8ljq7", "train-llama-0"} <= pods

    # No empty label, no `hostname`, no DCGM sentinel in the store.
    with alerting.engine.connect() as connection:
        label_sets = [dict(row) for row in connection.scalars(select(Series.labels))]
        values = [float(v) for v in connection.scalars(select(samples.c.value))]
    assert label_sets and all("" not in labels.values() for labels in label_sets)
    assert not any("hostname" in labels or "pod_uid" in labels for labels in label_sets)
    assert {labels["Hostname"] for labels in label_sets} == set(PAGES)
    assert all(math.isfinite(v) and v < DCGM_FP64_BLANK for v in values)
