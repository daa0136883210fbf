"""The agent against a live API: registration, the config subscription, acks, and a control
plane that goes away and comes back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from tests.agent.conftest import Live
from tuneloop.agent import Agent, ControlPlaneClient, RankInfo

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout_s: float = 10.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


class SwitchableTransport(httpx.HTTPTransport):
    """A real transport whose network can be pulled: while ``down`` every request fails to
    connect, as when the control plane's host is unreachable."""

    def __init__(self) -> None:
        super().__init__()
        self.down = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.down.is_set():
            raise httpx.ConnectError("control plane unreachable", request=request)
        return super().handle_request(request)


def make_agent(live: Live, transport: httpx.BaseTransport | None = None) -> Agent:
    client = ControlPlaneClient(
        live.url, live.agent_token, live.project, "resnet", transport=transport
    )
    return Agent(
        url=live.url,
        token=live.agent_token,
        project=live.project,
        job="resnet",
        world_size=2,
        instrument=False,
        poll_timeout_s=2,
        client=client,
    )


def desire(live: Live, config: dict[str, Any]) -> int:
    response = httpx.put(
        f"{live.job_url('resnet')}/config",
        json={"config": config},
        headers={"Authorization": f"Bearer {live.member_token}"},
    )
    assert response.status_code == 200, response.text
    return int(response.json()["version"])


def state(live: Live) -> dict[str, Any]:
    response = httpx.get(
        f"{live.job_url('resnet')}/config",
        headers={"Authorization": f"Bearer {live.member_token}"},
    )
    return dict(response.json())


def test_register_subscribe_apply_ack(live: Live) -> None:
    agent = make_agent(live)
    ranks = [RankInfo(0, ("GPU-aaaa",)), RankInfo(1, ("GPU-bbbb",))]
    agent.start({"batch_size": 32, "sync_period": 1}, ranks)
    try:
        # The job is created and the starting config adopted as version 1; the training loop
        # asks for news at its step boundaries, which acknowledges it.
        assert wait_for(lambda: agent.pending() is None and agent.version == 1)
        assert wait_for(lambda: state(live).get("observed"))
        assert state(live)["observed"]["version"] == 1
        assert agent.pending() is None
        assert agent.version == 1
        assert agent.agent_id is not None

        written = time.monotonic()
        assert desire(live, {"batch_size": 64, "sync_period": 2}) == 2
        pending = wait_for(agent.pending)
        assert time.monotonic() - written < 1.5
        assert pending is not None
        assert (pending.version, dict(pending.config)) == (2, {"batch_size": 64, "sync_period": 2})
        agent.applied(pending.version, pending.config, step=12)
        assert wait_for(lambda: state(live)["in_sync"])
        assert state(live)["observed"]["version"] == 2
        assert agent.pending() is None
    finally:
        agent.close()


def test_a_job_that_loses_the_control_plane_keeps_its_config(live: Live) -> None:
    transport = SwitchableTransport()
    agent = make_agent(live, transport)
    agent.start({"batch_size": 32})
    try:
        assert wait_for(lambda: agent.pending() is None and agent.version == 1)
        assert wait_for(lambda: state(live).get("observed"))  # acknowledged
        assert agent.connected
        transport.down.set()  # the long-poll in flight ends by its timeout; the next one fails
        assert wait_for(lambda: not agent.connected, timeout_s=15)
        # Meanwhile a new config is written; the job runs on, on what it has.
        desire(live, {"batch_size": 16})
        time.sleep(0.5)
        assert agent.pending() is None
        assert (agent.version, agent.config) == (1, {"batch_size": 32})
        transport.down.clear()
        pending = wait_for(agent.pending, timeout_s=40)  # backoff may wait up to ~30 s
        assert pending is not None and pending.version == 2
    finally:
        agent.close()


def test_an_agent_that_cannot_reach_anything_starts_anyway() -> None:
    agent = Agent(
        url="http://127.0.0.1:9",  # discard port: nothing listens
        token="tl_x",
        job="offline",
        instrument=False,
        poll_timeout_s=1,
    )
    started = time.monotonic()
    agent.start({"batch_size": 8})
    assert time.monotonic() - started < 0.5
    assert agent.pending() is None and not agent.connected
    agent.close()
