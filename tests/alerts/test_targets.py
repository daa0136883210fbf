"""Receiver targets: which addresses receivers may reach, checked when a receiver is created and
again on every connection (a name may resolve elsewhere by then), and what an error records."""

from __future__ import annotations

import socket
from collections.abc import Callable
from ipaddress import ip_address, ip_network
from typing import Any

import pytest

from alerts import store
from alerts.dispatch import Dispatcher
from alerts.notifiers.targets import TargetRefused, blocked_reason, check_url
from tests.alerts.conftest import Alerting
from tests.alerts.receivers import Receiver, Reply, serve
from tuneloop.errors import InvalidInput
from tuneloop.storage import session_scope

TEMP = "DCGM_FI_DEV_GPU_TEMP"
HOT = {"name": "GpuHot", "kind": "threshold", "query": {"metric": TEMP}, "op": ">", "threshold": 85}
LOCAL = (ip_network("127.0.0.0/8"),)
PUBLIC = "93.184.216.34"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "a cloud metadata address"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff0e::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "not a public address"),
        ("168.63.129.16", "a cloud metadata address"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.1.2.3", "private"),
        ("64:ff9b::a00:1", "private"),
        ("2002:7f00:1::", "loopback"),
        (PUBLIC, None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_what_receivers_may_not_reach(address: str, reason: str | None) -> None:
    assert blocked_reason(ip_address(address)) == reason


def test_an_allowed_network_lets_its_addresses_through() -> None:
    assert blocked_reason(ip_address("10.1.2.3"), (ip_network("10.0.0.0/8"),)) is None
    assert blocked_reason(ip_address("10.1.2.3"), (ip_network("192.168.0.0/16"),)) == "private"
    assert blocked_reason(ip_address("::ffff:127.0.0.1"), LOCAL) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/",
        "http://localhost:8080/hook",
        "http://[::1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://2130706433/",  # 127.0.0.1 as one number
        "https://0x7f000001/",  # ... and in hex
    ],
)
def test_urls_of_internal_addresses_are_refused(url: str) -> None:
    with pytest.raises(TargetRefused, match=r"TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS"):
        check_url(url, ())


def test_a_name_that_does_not_resolve_now_is_checked_when_sending(
    fake_dns: Callable[[str, list[str]], None],
) -> None:
    fake_dns("hooks.example.test", [])
    check_url("https://hooks.example.test/alerts", ())  # no error: checked on each connection


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, list[str]], None]:
    """Answers for the names it is given (the last answer given for a name holds), the real
    resolver for the others."""
    answers: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        if not answers[host]:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))
            for address in answers[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lambda host, addresses: answers.__setitem__(host, addresses)


def _fire(alerting: Alerting, dispatcher: Dispatcher) -> None:
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, [(0, 95.0)])
    alerting.evaluate(0)
    dispatcher.dispatch()
    assert dispatcher.drain()
    dispatcher.close()


def test_a_receiver_is_refused_at_creation(alerting: Alerting) -> None:
    for config in (
        {"url": "http://localhost:9/"},
        {"url": "http://[::1]:9/"},
        {"url": "http://169.254.169.254/"},
    ):
        with pytest.raises(InvalidInput, match=r"loopback|metadata"):
            alerting_receiver(alerting, "webhook", config)
    with pytest.raises(InvalidInput, match="private"):
        alerting_receiver(alerting, "pagerduty", {"routing_key": "k", "url": "http://10.0.0.1/"})
    with pytest.raises(InvalidInput, match="loopback"):
        alerting_receiver(
            alerting, "email", {"to": ["a@b.c"], "from": "t@b.c", "host": "127.0.0.1"}
        )


def alerting_receiver(alerting: Alerting, kind: str, config: dict[str, Any]) -> None:
    """A receiver created with no network allowed (the default of a deployment)."""
    with session_scope(alerting.sessions) as session:
        store.create_receiver(
            session, alerting.project(session), name="r", kind=kind, config=config,
            allowed_networks=(),
        )  # fmt: skip


def test_a_name_that_resolves_elsewhere_when_sending_is_refused_then(
    alerting: Alerting, fake_dns: Callable[[str, list[str]], None]
) -> None:
    """DNS rebinding: public when the receiver was created, loopback when it is used."""
    with serve(Receiver()) as receiver:
        port = receiver.url.rsplit(":", 1)[1]
        fake_dns("hooks.example.test", [PUBLIC])
        alerting.rule(**HOT)
        alerting_receiver(alerting, "webhook", {"url": f"http://hooks.example.test:{port}/"})
        fake_dns("hooks.example.test", ["127.0.0.1"])
        _fire(alerting, Dispatcher(alerting.sessions, allowed_networks=()))
        assert receiver.received == []
    assert alerting.outcomes() == [("r", "firing", "failed", 1)]
    error = alerting.receiver_row("r").last_error
    assert error is not None and "hooks.example.test (127.0.0.1) is loopback" in error


def test_the_connection_goes_to_the_checked_address_with_the_name_as_host(
    alerting: Alerting, fake_dns: Callable[[str, list[str]], None]
) -> None:
    with serve(Receiver()) as receiver:
        port = receiver.url.rsplit(":", 1)[1]
        fake_dns("hooks.example.test", ["127.0.0.1"])
        alerting.rule(**HOT)
        alerting.receiver("hook", f"http://hooks.example.test:{port}/alerts")
        _fire(alerting, Dispatcher(alerting.sessions, allowed_networks=LOCAL))
        (received,) = receiver.wait_for(1)
    assert received.headers["Host"] == f"hooks.example.test:{port}"
    assert alerting.outcomes() == [("hook", "firing", "sent", 1)]


def test_an_error_records_the_status_not_the_answer(alerting: Alerting) -> None:
    secret = "db_password=hunter2 <html>internal admin page</html>"
    with serve(Receiver(Reply(500, secret))) as failing, serve(Receiver(Reply(403, secret))) as no:
        alerting.rule(**HOT)
        alerting.receiver("failing", failing.url)
        alerting.receiver("forbidden", no.url)
        _fire(alerting, Dispatcher(alerting.sessions))
    assert alerting.receiver_row("failing").last_error == "HTTP 500: Internal Server Error"
    assert alerting.receiver_row("forbidden").last_error == "HTTP 403: Forbidden"


def test_a_redirect_is_not_followed(alerting: Alerting) -> None:
    with serve(Receiver()) as target:
        moved = Reply(302, "", headers={"Location": f"{target.url}/elsewhere"})
        with serve(Receiver(moved)) as redirecting:
            alerting.rule(**HOT)
            alerting.receiver("moved", redirecting.url)
            _fire(alerting, Dispatcher(alerting.sessions))
            assert len(redirecting.received) == 1
        assert target.received == []
    assert alerting.outcomes() == [("moved", "firing", "failed", 1)]
    assert alerting.receiver_row("moved").last_error == "HTTP 302: Found"
