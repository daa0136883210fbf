"""Where notifications may go: public addresses only, unless an operator allows a network
(``TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS``).

A receiver's URL or mail host is chosen by whoever configures the receiver, and the server
sends requests there; without this check a receiver could reach the loopback interface, the
private network or a cloud metadata service. A target is checked when a receiver is created
and again on every connection, against the addresses the connection then uses (a name that
resolved to a public address at creation may resolve to another later: DNS rebinding).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

import httpx

from alerts.notifiers.config import AlertmanagerConfig, EmailConfig, ReceiverConfig
from tuneloop.settings import get_settings

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

ALLOW_SETTING = "TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS"

METADATA_ADDRESSES = frozenset(
    ip_address(text)
    for text in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, ...
        "169.254.170.2",  # AWS ECS task credentials
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure's wire server: a public address
    )
)
"""Cloud metadata services, refused although some of them are public addresses."""

_NAT64 = IPv6Network("64:ff9b::/96")


class TargetRefused(Exception):
    """A notification target outside what receivers may reach; ``str()`` says why."""


def _embedded_ipv4(address: IPAddress) -> IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64), which is what is
    reached."""
    if not isinstance(address, IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def blocked_reason(address: IPAddress, allowed: Sequence[IPNetwork] = ()) -> str | None:
    """Why receivers may not reach ``address`` (``loopback``, ``private``, ...), or ``None``."""
    if any(address.version == network.version and address in network for network in allowed):
        return None
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return blocked_reason(embedded, allowed)
    checks = (
        (address in METADATA_ADDRESSES, "a cloud metadata address"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address.is_unspecified, "unspecified"),
        (address.is_reserved, "reserved"),
        (address.is_private, "private"),
        (not address.is_global, "not a public address"),
    )
    return next((reason for blocked, reason in checks if blocked), None)


def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses of ``host`` (itself when it is an address); ``socket.gaierror`` if the
    name does not resolve."""
    try:
        return [ip_address(host.strip("[]"))]
    except ValueError:
        pass
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # dict.fromkeys: distinct, in the resolver's order of preference.
    return list(dict.fromkeys(ip_address(str(info[4][0])) for info in found))


def checked_addresses(host: str, port: int, allowed: Sequence[IPNetwork]) -> list[IPAddress]:
    """The addresses to connect to for ``host``: all of them, since one refused address
    refuses the name (a name may mix public and private records)."""
    addresses = resolve(host, port)
    for address in addresses:
        reason = blocked_reason(address, allowed)
        if reason is not None:
            shown = host if host == str(address) else f"{host} ({address})"
            raise TargetRefused(
                f"{shown} is {reason}: receivers may not reach it unless an operator allows "
                f"its network in {ALLOW_SETTING}"
            )
    return addresses


def check_host(host: str, port: int, allowed: Sequence[IPNetwork]) -> None:
    """Refuse a target that resolves to a blocked address now. A name that does not resolve
    here is let through: the check on every connection still applies."""
    try:
        checked_addresses(host, port, allowed)
    except socket.gaierror:
        return


def check_url(url: str, allowed: Sequence[IPNetwork]) -> None:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise TargetRefused(f"invalid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise TargetRefused("must be an http:// or https:// URL with a host")
    check_host(parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80), allowed)


def check_receiver(config: ReceiverConfig, allowed: Sequence[IPNetwork]) -> None:
    """Refuse a receiver whose target (URL, or mail server) receivers may not reach."""
    if isinstance(config, EmailConfig):
        check_host(config.host, config.port, allowed)
    elif isinstance(config, AlertmanagerConfig):
        for url in config.urls:
            check_url(url, allowed)
    else:
        check_url(config.url, allowed)


def connect_checked(
    host: str, port: int, allowed: Sequence[IPNetwork], timeout_s: float | None
) -> socket.socket:
    """A TCP connection to the first reachable checked address of ``host``."""
    last: OSError | None = None
    for address in checked_addresses(host, port, allowed):
        try:
            return socket.create_connection((str(address), port), timeout_s)
        except OSError as exc:
            last = exc
    raise last or OSError(f"no address for {host}")


def configured_networks() -> tuple[IPNetwork, ...]:
    """The networks the process's settings allow (none by default)."""
    return tuple(get_settings().alerts_allowed_target_networks)
