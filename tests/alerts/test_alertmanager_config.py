"""The shipped Alertmanager configuration (alerts/prometheus/alertmanager.yml): amtool accepts
it, and in a real Alertmanager 0.25 its inhibit rule mutes the GPU alerts of the node that is
down and only those, with the alerts pushed by tuneloop's ``alertmanager`` notifier."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from alerts.notifiers.alertmanager import AlertmanagerNotifier
from alerts.notifiers.base import AlertMessage, GroupMessage
from alerts.notifiers.config import AlertmanagerConfig
from alerts.notifiers.transport import checked_client
from tests.helpers import wait_for
from tests.peers import alertmanager_alerts, binary, running_alertmanager
from tuneloop.settings import get_settings
from tuneloop.storage.types import utcnow

PROMETHEUS = Path(__file__).resolve().parents[2] / "alerts/prometheus"


def shipped(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((PROMETHEUS / name).read_text())
    return loaded


def test_amtool_accepts_the_complete_configuration() -> None:
    result = subprocess.run(
        [binary("amtool"), "check-config", "alertmanager.yml"],
        cwd=PROMETHEUS, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "1 inhibit rules" in result.stdout


def test_the_snippet_is_the_complete_configurations_inhibit_rule() -> None:
    snippet = shipped("alertmanager-inhibit.yml")
    assert snippet["inhibit_rules"] == shipped("alertmanager.yml")["inhibit_rules"]
    assert snippet["inhibit_rules"][0]["equal"] == ["Hostname"]


def alert(name: str, **labels: str) -> AlertMessage:
    started = utcnow() - timedelta(minutes=1)
    full = {"alertname": name, **labels}
    return AlertMessage(0, "firing", name + str(labels), full, {}, started, None, 1.0)


def test_a_down_node_mutes_only_its_own_gpus_alerts(
    tmp_path: Path, local_receivers_allowed: None
) -> None:
    config = shipped("alertmanager.yml")
    # Hermetic: the same receivers, sending nowhere.
    config["receivers"] = [{"name": receiver["name"]} for receiver in config["receivers"]]
    with running_alertmanager(config, tmp_path / "am") as url:
        client = checked_client(get_settings().alerts_allowed_target_networks)
        notifier = AlertmanagerNotifier(client)
        alerts = [
            alert("GpuNodeDown", Hostname="a", severity="critical"),
            alert("GpuTemperatureHigh", Hostname="a", gpu="0", severity="warning"),
            alert("GpuTemperatureHigh", Hostname="b", gpu="0", severity="warning"),
            alert("GpuXidError", Hostname="b", gpu="1", severity="critical"),
        ]
        outcome = notifier.send(AlertmanagerConfig(urls=[url]), GroupMessage("am", "", {}, alerts))
        assert outcome.status == "sent", outcome
        client.close()

        def states() -> dict[tuple[str, str, str], str]:
            return {
                (a["labels"]["alertname"], a["labels"]["Hostname"], a["labels"].get("gpu", "")): (
                    a["status"]["state"]
                )
                for a in alertmanager_alerts(url)
            }

        expected = {
            ("GpuNodeDown", "a", ""): "active",
            ("GpuTemperatureHigh", "a", "0"): "suppressed",
            ("GpuTemperatureHigh", "b", "0"): "active",
            ("GpuXidError", "b", "1"): "active",
        }
        wait_for(lambda: states() == expected, 10, f"inhibition as {expected}", every_s=0.2)
        (muted,) = alertmanager_alerts(url, inhibited="true", active="false")
        assert muted["labels"]["Hostname"] == "a"
        assert len(muted["status"]["inhibitedBy"]) == 1
