"""An agent whose token is refused says so once, clearly, whichever request met the refusal."""

from __future__ import annotations

import logging

import httpx
import pytest
import requests

from tuneloop.agent import client as client_module
from tuneloop.agent import steps
from tuneloop.agent.client import ControlPlaneClient, ProtocolError
from tuneloop.agent.refusals import TokenRefusals


@pytest.fixture
def refusals(monkeypatch: pytest.MonkeyPatch) -> TokenRefusals:
    fresh = TokenRefusals()
    monkeypatch.setattr(client_module, "TOKEN_REFUSALS", fresh)
    monkeypatch.setattr(steps, "TOKEN_REFUSALS", fresh)
    return fresh


def _client(statuses: list[int]) -> ControlPlaneClient:
    def answer(_request: httpx.Request) -> httpx.Response:
        status = statuses.pop(0)
        if status == 200:
            return httpx.Response(200, json={"version": 1, "config": {}})
        return httpx.Response(status, json={"detail": "invalid, expired or revoked token"})

    return ControlPlaneClient("http://cp", "tl_x", "p", "j", transport=httpx.MockTransport(answer))


def _refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.ERROR and "refused the agent's token" in record.getMessage()
    ]


def test_a_refused_token_is_logged_once_until_accepted_again(
    refusals: TokenRefusals, caplog: pytest.LogCaptureFixture
) -> None:
    client = _client([401, 401, 401, 200, 401])
    caplog.set_level(logging.INFO)
    for _ in range(3):
        with pytest.raises(ProtocolError):
            client.next_config(0, timeout_s=1)
    (line,) = _refusal_lines(caplog)
    assert "HTTP 401" in line and "config updates" in line and "revoked token" in line
    assert client.next_config(0, timeout_s=1) is not None  # accepted again
    with pytest.raises(ProtocolError):
        client.next_config(0, timeout_s=1)
    assert len(_refusal_lines(caplog)) == 2  # a new refusal is said again


def test_the_exporters_report_a_refused_token_too(
    refusals: TokenRefusals, caplog: pytest.LogCaptureFixture
) -> None:
    session = steps._watched_session("metrics export")
    refused = requests.Response()
    refused.status_code = 403
    refused._content = b'{"detail": "needs an agent token of project p"}'
    for _ in range(2):
        for hook in session.hooks["response"]:
            hook(refused)
    (line,) = _refusal_lines(caplog)
    assert "HTTP 403" in line and "metrics export" in line
