"""The default GPU-fleet rule pack: valid, complete, the same in tuneloop and Prometheus form,
and working end to end on samples in the store."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from alerts import store
from alerts.rules import RuleFile, parse_rule_file
from tests.alerts.conftest import Alerting
from tests.helpers import promtool
from tuneloop.storage import session_scope

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "alerts/pack/gpu-fleet.yaml"
PROMETHEUS = ROOT / "alerts/prometheus"
COVERED = {
    "GPU idle while its job runs": "GpuIdleWhileJobRuns",
    "XID errors": "GpuXidError",
    "thermal throttling": "GpuThermalThrottling",
    "power throttling": "GpuPowerThrottling",
    "ECC errors": "GpuEccDoubleBitErrors",
    "row-remap errors": "GpuRowRemapFailure",
    "framebuffer nearly full": "GpuFramebufferNearlyFull",
    "NVLink errors": "NvlinkCrcErrors",
    "step-time regression": "StepTimeRegression",
    "P99 SLO breach": "InferenceP99SloBreach",
    "data-loader stall": "DataLoaderStall",
    "collector silent": "GpuNodeDown",
    "job silent": "JobSilent",
}


def pack() -> RuleFile:
    return parse_rule_file(PACK.read_text(), source=str(PACK))


def prometheus_rules() -> dict[str, dict[str, object]]:
    groups = yaml.safe_load((PROMETHEUS / "gpu-fleet.rules.yml").read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def test_the_pack_covers_the_fleet_and_every_rule_has_a_runbook() -> None:
    rules = {rule.name: rule for rule in pack().rules}
    assert set(COVERED.values()) <= set(rules)
    for rule in rules.values():
        assert rule.annotations.get("summary"), rule.name
        assert rule.annotations.get("runbook"), rule.name
    assert [i.source for i in pack().inhibit_rules] == [('alertname="GpuNodeDown"',)]


def test_the_prometheus_pack_is_the_same_pack() -> None:
    ours = {rule.name: rule for rule in pack().rules}
    theirs = prometheus_rules()
    assert set(theirs) == set(ours)
    for name, rule in ours.items():
        other = theirs[name]
        assert other["labels"] == {"severity": rule.severity.value}, name
        assert str(other.get("for", "0s")) == (rule.for_ if rule.for_s else "0s"), name
        annotations = other["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook"] == rule.annotations["runbook"], name
    inhibit = yaml.safe_load((PROMETHEUS / "alertmanager-inhibit.yml").read_text())
    (rule,) = inhibit["inhibit_rules"]
    (ours_inhibit,) = pack().inhibit_rules
    assert tuple(rule["source_matchers"]) == ours_inhibit.source
    assert tuple(rule["target_matchers"]) == ours_inhibit.target
    # The same host label, as each side spells it: tuneloop's collectors `hostname`,
    # dcgm-exporter (which the Prometheus pack reads) `Hostname`.
    assert ours_inhibit.equal == ("hostname",)
    assert rule["equal"] == ["Hostname"]


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


def test_the_pack_on_a_fleet_with_a_node_down(alerting: Alerting) -> None:
    with session_scope(alerting.sessions) as session:
        outcome = store.load_rule_file(session, alerting.project(session), pack(), source="pack")
    assert len(outcome["created"]) == len(pack().rules)
    alerting.receiver()
    util, xid = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS"
    for host, until in (("n1", 600), ("n2", 300)):
        labels = {"gpu": "1", "hostname": host}
        alerting.write(util, labels, [(t, 80.0) for t in range(0, until + 1, 30)])
        alerting.write(
            xid, labels, [(t, 0.0 if t < 270 else 79.0) for t in range(0, until + 1, 30)]
        )
    alerting.evaluate(600)
    assert alerting.states() == {
        "GpuNodeDown/hostname=n2": "firing",
        "GpuXidError/gpu=1/hostname=n1": "firing",
        "GpuXidError/gpu=1/hostname=n2": "firing",
    }
    assert alerting.instance("GpuXidError/gpu=1/hostname=n1").annotations["summary"] == (
        "XID 79 on GPU 1 of n1"
    )
    assert alerting.instance("GpuXidError/gpu=1/hostname=n2").muted_by == "inhibited"
    assert sorted(alerting.notifications()) == [
        ("hook", "firing", "GpuNodeDown/hostname=n2"),
        ("hook", "firing", "GpuXidError/gpu=1/hostname=n1"),
    ]
