"""The default GPU-fleet rule pack: valid, complete, the same in tuneloop and Prometheus form,
and working end to end on samples in the store."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from alerts import store
from alerts.prometheus_export import export
from alerts.rules import RuleError, RuleFile, parse_rule_file
from tests.alerts.conftest import Alerting
from tests.helpers import promtool
from tuneloop.storage import session_scope
from tuneloop.storage.timeseries.types import SeriesKind

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "alerts/pack/gpu-fleet.yaml"
PROMETHEUS = ROOT / "alerts/prometheus"
RUNBOOKS = ROOT / "docs/runbooks.md"
COVERED = {
    "GPU idle while its job runs": "GpuIdleWhileJobRuns",
    "MIG slice idle while its job runs": "GpuMigSliceIdleWhileJobRuns",
    "XID errors (counted)": "GpuXidErrors",
    "XID errors (last-value gauge)": "GpuXidError",
    "DCGM health": "GpuHealthNotPassing",
    "thermal throttling": "GpuThermalThrottling",
    "power throttling": "GpuPowerThrottling",
    "ECC errors": "GpuEccDoubleBitErrors",
    "row-remap errors": "GpuRowRemapFailure",
    "framebuffer full on an idle GPU": "GpuFramebufferFullWhileIdle",
    "NVLink errors": "NvlinkCrcErrors",
    "step-time regression": "StepTimeRegression",
    "P99 SLO breach": "InferenceP99SloBreach",
    "data-loader stall": "DataLoaderStall",
    "input-bound job": "JobInputBound",
    "straggler rank": "JobStraggler",
    "collector silent": "GpuNodeDown",
    "job silent": "JobSilent",
}
ANNOTATIONS = {"summary", "description"}
"""The pack names no runbook address of its own: ``runbook_base_url`` adds ``runbook_url``."""
PUBLISHED = "https://git.example.com/ops/tuneloop/blob/main/docs/runbooks.md"


def pack() -> RuleFile:
    return parse_rule_file(PACK.read_text(), source=str(PACK))


def prometheus_rules() -> dict[str, dict[str, object]]:
    groups = yaml.safe_load((PROMETHEUS / "gpu-fleet.rules.yml").read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def test_the_pack_covers_the_fleet_and_every_rule_is_annotated() -> None:
    rules = {rule.name: rule for rule in pack().rules}
    assert set(COVERED.values()) <= set(rules)
    anchors = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), re.MULTILINE))
    assert pack().runbook_base_url == ""
    for rule in rules.values():
        assert set(rule.annotations) == ANNOTATIONS, rule.name
        assert rule.name in anchors, f"docs/runbooks.md has no section for {rule.name}"
        # The host is named as the vocabulary spells it, never as `hostname`.
        assert "$labels.hostname" not in rule.annotations["summary"], rule.name
    assert [i.source for i in pack().inhibit_rules] == [('alertname="GpuNodeDown"',)]


def test_the_prometheus_pack_is_generated_from_the_pack() -> None:
    committed = (PROMETHEUS / "gpu-fleet.rules.yml").read_text()
    generated = export(pack(), source="alerts/pack/gpu-fleet.yaml", group="tuneloop-gpu-fleet")
    assert committed == generated, (
        "alerts/prometheus/gpu-fleet.rules.yml is stale: regenerate it with "
        "python -m alerts.prometheus_export alerts/pack/gpu-fleet.yaml"
    )
    ours = {rule.name: rule for rule in pack().rules}
    assert set(prometheus_rules()) == set(ours)
    inhibit = yaml.safe_load((PROMETHEUS / "alertmanager-inhibit.yml").read_text())
    (rule,) = inhibit["inhibit_rules"]
    (ours_inhibit,) = pack().inhibit_rules
    assert tuple(rule["source_matchers"]) == ours_inhibit.source
    assert tuple(rule["target_matchers"]) == ours_inhibit.target
    # One host label on both sides: dcgm-exporter's, which every tuneloop source writes too.
    assert ours_inhibit.equal == ("Hostname",)
    assert rule["equal"] == ["Hostname"]


def test_every_rule_has_a_promtool_test_that_fires_it() -> None:
    tests = yaml.safe_load((PROMETHEUS / "gpu-fleet.test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for group in tests
        for case in group["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert fired == set(prometheus_rules())


def test_the_runnable_export_writes_the_committed_file() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "alerts.prometheus_export", "alerts/pack/gpu-fleet.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (PROMETHEUS / "gpu-fleet.rules.yml").read_text()


def test_runbook_links_come_from_the_base_url_given() -> None:
    text = PACK.read_text()
    linked = parse_rule_file(text, runbook_base_url=PUBLISHED)
    assert linked.runbook_base_url == PUBLISHED
    for rule in linked.rules:
        assert rule.annotations["runbook_url"] == f"{PUBLISHED}#{rule.name.lower()}"
    # The pack's own key, the one given overriding it; a rule's own link is kept.
    own = text.replace('runbook_base_url: ""', f"runbook_base_url: {PUBLISHED}")
    assert parse_rule_file(own).rules == linked.rules
    other = parse_rule_file(own, runbook_base_url="https://wiki.example/gpu")
    assert (
        other.rules[0].annotations["runbook_url"] == "https://wiki.example/gpu#gpuidlewhilejobruns"
    )
    kept = parse_rule_file(
        RULE_WITH_RUNBOOK.replace("BASE", PUBLISHED), runbook_base_url="https://wiki.example/x"
    )
    assert kept.rules[0].annotations["runbook_url"] == "https://runbooks.example/hot"
    for bad in ("ftp://x.example/r.md", "runbooks.md", f"{PUBLISHED}#top"):
        with pytest.raises(RuleError, match="runbook_base_url: expected an http"):
            parse_rule_file(text, runbook_base_url=bad)


RULE_WITH_RUNBOOK = """
runbook_base_url: BASE
rules:
  - name: Hot
    kind: threshold
    query: {metric: DCGM_FI_DEV_GPU_TEMP}
    op: ">"
    threshold: 85
    annotations: {runbook_url: "https://runbooks.example/hot"}
"""


def test_the_export_takes_a_runbook_base_url() -> None:
    result = subprocess.run(
        [
            sys.executable, "-m", "alerts.prometheus_export", "alerts/pack/gpu-fleet.yaml",
            "--runbook-base-url", PUBLISHED,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    groups = yaml.safe_load(result.stdout)["groups"]
    links = {rule["alert"]: rule["annotations"]["runbook_url"] for rule in groups[0]["rules"]}
    assert links == {name: f"{PUBLISHED}#{name.lower()}" for name in prometheus_rules()}
    refused = subprocess.run(
        [sys.executable, "-m", "alerts.prometheus_export", "alerts/pack/gpu-fleet.yaml",
         "--runbook-base-url", "runbooks.md"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert refused.returncode == 2 and "runbook_base_url: expected an http" in refused.stderr


@pytest.mark.parametrize(
    "command",
    [["check", "rules", "gpu-fleet.rules.yml"], ["test", "rules", "gpu-fleet.test.yml"]],
    ids=["check", "test"],
)
def test_promtool_passes_on_the_prometheus_pack(command: list[str]) -> None:
    result = subprocess.run(
        [promtool(), *command],
        cwd=PROMETHEUS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def load_pack(alerting: Alerting) -> None:
    with session_scope(alerting.sessions) as session:
        outcome = store.load_rule_file(session, alerting.project(session), pack(), source="pack")
    assert len(outcome["created"]) == len(pack().rules)


def test_the_pack_on_a_fleet_with_a_node_down(alerting: Alerting) -> None:
    load_pack(alerting)
    alerting.receiver()
    temp, xid = "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"
    counted = "DCGM_EXP_XID_ERRORS_COUNT"
    for host, until in (("n1", 600), ("n2", 300)):
        labels = {"gpu": "1", "Hostname": host}
        alerting.write(temp, labels, [(t, 60.0) for t in range(0, until + 1, 30)])
        alerting.write(
            xid, labels, [(t, 0.0 if t < 270 else 79.0) for t in range(0, until + 1, 30)]
        )
    # n1's exporter counts XIDs too: the counted rule speaks for it, the gauge's stays quiet.
    window = {"gpu": "1", "Hostname": "n1", "xid": "79", "window_size_in_ms": "300000"}
    alerting.write(
        counted,
        window,
        [(t, 0.0 if t < 270 else 1.0) for t in range(0, 601, 30)],
        SeriesKind.COUNTER,
    )
    alerting.evaluate(600)
    assert alerting.states() == {
        "GpuNodeDown/Hostname=n2": "firing",
        "GpuXidErrors/Hostname=n1/gpu=1/window_size_in_ms=300000/xid=79": "firing",
        "GpuXidError/Hostname=n2/gpu=1": "firing",
    }
    counted_alert = alerting.instance(
        "GpuXidErrors/Hostname=n1/gpu=1/window_size_in_ms=300000/xid=79"
    )
    assert counted_alert.annotations["summary"] == (
        "XID 79 on GPU 1 of n1 (1 in dcgm-exporter's window)"
    )
    assert alerting.instance("GpuNodeDown/Hostname=n2").annotations["summary"] == (
        "No GPU metrics from n2 for over 3m"
    )
    assert alerting.instance("GpuXidError/Hostname=n2/gpu=1").muted_by == "inhibited"
    assert sorted(alerting.notifications()) == [
        ("hook", "firing", "GpuNodeDown/Hostname=n2"),
        ("hook", "firing", "GpuXidErrors/Hostname=n1/gpu=1/window_size_in_ms=300000/xid=79"),
    ]


def test_p99_is_over_the_jobs_histograms_added_up(alerting: Alerting) -> None:
    load_pack(alerting)
    metric = "http_server_request_duration_seconds_bucket"
    # Replica a alone: P99 991ms; b alone: 99ms; both added up: 901ms (as promtool's test).
    for instance, slow, fast in (("a", 60.0, 0.0), ("b", 600.0, 600.0)):
        for le, per_minute in (("0.1", fast), ("1", slow), ("+Inf", slow)):
            labels = {"job": "vllm", "instance": instance, "le": le}
            points = [(t, per_minute * t / 60) for t in range(0, 1201, 60)]
            alerting.write(metric, labels, points, SeriesKind.COUNTER)
    alerting.evaluate(420)
    alerting.evaluate(720)
    alert = alerting.instance("InferenceP99SloBreach/job=vllm")
    assert alert.state == "firing"
    assert alert.annotations["summary"] == "P99 latency of vllm is 901ms, over its 500ms SLO"


def test_a_busy_gpu_with_its_framebuffer_held_does_not_fire(alerting: Alerting) -> None:
    load_pack(alerting)
    fb, util = "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"
    minutes = range(0, 1201, 60)
    for gpu, busy in (("0", 2.0), ("1", 95.0)):  # gpu 1: PyTorch's allocator, training
        labels = {"gpu": gpu, "Hostname": "n1", "pod": "llama-0", "namespace": "ml"}
        alerting.write(fb, labels, [(t, 500.0) for t in minutes])
        alerting.write(util, labels, [(t, busy) for t in minutes])
    for t in (300, 600, 960):
        alerting.evaluate(t)
    firing = {name for name, state in alerting.states().items() if state == "firing"}
    assert "GpuFramebufferFullWhileIdle/Hostname=n1/gpu=0/namespace=ml/pod=llama-0" in firing
    assert not any(
        name.startswith("GpuFramebufferFullWhileIdle/Hostname=n1/gpu=1") for name in firing
    )
