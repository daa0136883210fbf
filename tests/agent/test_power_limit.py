"""The power-limit knob through the real agent and a live API (SQLite and PostgreSQL), on a
fake NVML (``FakeNvml`` with a ``FakeGpuPower`` model: no GPU where the tests run): set and
verified before the job gets the config, put back when the config goes back and when the agent
closes, and refused clearly where the driver does not allow it, the refusal reported, visible in
the API and rolled back by the actuator."""

from __future__ import annotations

from typing import Any

import httpx
import pynvml
import pytest

from tests.agent.conftest import Live
from tests.agent.test_subscription import desire, state, wait_for
from tests.collector.fake_gpu_power import FakeGpuPower
from tests.collector.fakes import FakeNvml, FakeNvmlDevice, h100_answers
from tuneloop.agent import Agent, ControlPlaneClient, GpuPowerLimit, Released

START = {"batch_size": 32}
AT_700 = {**START, "power_limit_w": 700}
"""What the agent registers: the job's config and the limit its GPUs were found at."""


def h100_pair(**power: Any) -> FakeNvml:
    """Two H100 SXM boards: 200-700 W, 700 W by default (as nvidia-smi -q -d POWER shows)."""
    devices = [
        FakeNvmlDevice(
            h100_answers(uuid=f"GPU-{i}", bus_id=f"00000000:{18 + i:02X}:00.0", minor=i),
            power=FakeGpuPower(**power),
        )
        for i in range(2)
    ]
    return FakeNvml(devices)


def limits_w(nvml: FakeNvml) -> list[float]:
    return [d.power.enforced_mw() / 1000 for d in nvml.devices if d.power is not None]


def power_agent(live: Live, nvml: FakeNvml) -> Agent:
    client = ControlPlaneClient(live.url, live.agent_token, live.project, "resnet")
    return Agent(
        url=live.url,
        token=live.agent_token,
        project=live.project,
        job="resnet",
        instrument=False,
        poll_timeout_s=2,
        client=client,
        power=GpuPowerLimit(nvml=nvml),
    )


def take(agent: Agent) -> Released:
    """What the training loop does at a step boundary: take the pending config and run it."""
    pending = wait_for(agent.pending)
    assert pending is not None
    agent.applied(pending.version, pending.config, step=10 * pending.version)
    return pending


def registered_power(live: Live) -> dict[str, Any]:
    response = httpx.get(
        f"{live.job_url('resnet')}/agents",
        headers={"Authorization": f"Bearer {live.member_token}"},
    )
    assert response.status_code == 200, response.text
    return dict(response.json()[-1]["details"]["power_limit_w"])


def test_the_limit_is_set_verified_rolled_back_and_restored_by_the_agent(live: Live) -> None:
    nvml = h100_pair()
    agent = power_agent(live, nvml)
    agent.start(START)
    try:
        assert wait_for(lambda: agent.pending() is None and agent.version == 1)
        assert state(live)["desired"]["config"] == AT_700, "the limit it runs at, registered"
        # The range to tune over, as the boards report it.
        assert registered_power(live) == {
            "min_w": 200,
            "max_w": 700,
            "default_w": 700,
            "found_w": [700, 700],
            "gpus": [0, 1],
        }
        desire(live, {**START, "power_limit_w": 450})
        # Set and verified before the job is handed the config.
        assert take(agent).config["power_limit_w"] == 450
        assert limits_w(nvml) == [450.0, 450.0]
        assert wait_for(lambda: state(live)["in_sync"])
        # The config goes back (as a rollback releases it): so does the limit.
        desire(live, AT_700)
        take(agent)
        assert limits_w(nvml) == [700.0, 700.0]
        desire(live, {**START, "power_limit_w": 300})
        take(agent)
        # A config without the knob runs at the limits found.
        desire(live, START)
        take(agent)
        assert limits_w(nvml) == [700.0, 700.0]
        desire(live, {**START, "power_limit_w": 300})
        take(agent)
        assert limits_w(nvml) == [300.0, 300.0]
    finally:
        agent.close()
    # A job never leaves its GPUs capped.
    assert limits_w(nvml) == [700.0, 700.0]
    sets = [450_000, 700_000, 300_000, 700_000, 300_000, 700_000]
    assert [d.power.sets for d in nvml.devices if d.power] == [sets] * 2


@pytest.mark.parametrize(
    ("power", "words"),
    [
        (
            {"refuse_with": pynvml.NVML_ERROR_NO_PERMISSION},
            "GPU 0 refused 450 W: Insufficient Permissions (setting a power limit needs root or "
            "CAP_SYS_ADMIN, as nvidia-smi -pl)",
        ),
        (
            {"refuse_with": pynvml.NVML_ERROR_NOT_SUPPORTED},
            "GPU 0 refused 450 W: Not Supported (this GPU has no settable power limit)",
        ),
        (
            {"capped_mw": 400_000},
            "GPU 0 enforces 400 W after 450 W was set (another limit holds it lower)",
        ),
    ],
    ids=["no-permission", "not-supported", "capped-elsewhere"],
)
def test_a_limit_the_driver_refuses_is_reported_and_rolled_back(
    live: Live, power: dict[str, Any], words: str
) -> None:
    nvml = h100_pair(**power)
    agent = power_agent(live, nvml)
    agent.start(START)
    try:
        assert wait_for(lambda: agent.pending() is None and agent.version == 1)
        assert desire(live, {**START, "power_limit_w": 450}) == 2
        # The training loop asks at each step; it is never handed version 2: the agent
        # reports that the job could not run it.
        observed = wait_for(lambda: agent.pending() is None and _failed(state(live)))
        assert observed is not None, state(live)
        assert observed["acknowledged_version"] == 2
        assert observed["reason"] == f"power_limit_w: {words}"
        assert observed["config"] == AT_700, "the config the job kept running"
        assert limits_w(nvml) == [700.0, 700.0] or power.get("capped_mw")
        # The actuator rolls it back to what the job runs; the agent takes that as running.
        assert wait_for(lambda: agent.pending() is None and agent.version == 3, 15)
        assert agent.config == AT_700
        assert wait_for(lambda: state(live)["in_sync"]), "acknowledged in the background"
        now = state(live)
        assert now["desired"]["version"] == 3 and now["desired"]["config"] == AT_700
        marks = httpx.get(
            f"{live.job_url('resnet')}/config/marks",
            headers={"Authorization": f"Bearer {live.member_token}"},
        ).json()
        assert [(m["version"], m["reason"]) for m in marks] == [(2, "refused_by_job")]
        assert words in marks[0]["evidence"]["message"]
    finally:
        agent.close()
    assert limits_w(nvml) == [700.0, 700.0] or power.get("capped_mw")


def _failed(now: dict[str, Any]) -> dict[str, Any] | None:
    observed = now.get("observed")
    return observed if observed and observed.get("status") == "failed" else None
