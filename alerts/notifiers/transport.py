"""The HTTP client of the notifiers: every connection goes to an address checked by
:mod:`alerts.notifiers.targets` (the one the name resolves to at that moment), no redirect is
followed, and proxy variables of the environment are ignored (a proxy would make the checked
address the proxy's)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import httpcore
import httpx

from alerts.notifiers.targets import IPNetwork, TargetRefused, checked_addresses


class CheckedBackend(httpcore.NetworkBackend):
    """Resolves and checks the host itself, then connects to the checked address; TLS still
    verifies the certificate against the URL's host name (httpcore passes it separately)."""

    def __init__(self, allowed: Sequence[IPNetwork]) -> None:
        self.allowed = tuple(allowed)
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = checked_addresses(host, port, self.allowed)
        except OSError as exc:  # the name does not resolve (now): retried later
            raise httpcore.ConnectError(f"could not resolve {host}") from exc
        options = list(socket_options or ())
        last: Exception | None = None
        for address in addresses:
            try:
                return self._inner.connect_tcp(str(address), port, timeout, local_address, options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise TargetRefused("receivers may not reach a Unix socket")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class CheckedTransport(httpx.HTTPTransport):
    def __init__(self, allowed: Sequence[IPNetwork]) -> None:
        super().__init__(trust_env=False)
        # httpx has no public hook on the connection step; its connection pool has one.
        limits = httpx.Limits()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=CheckedBackend(allowed),
        )


def checked_client(allowed: Sequence[IPNetwork]) -> httpx.Client:
    return httpx.Client(
        transport=CheckedTransport(allowed), follow_redirects=False, trust_env=False
    )
