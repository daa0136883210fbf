"""Scale anything that takes an HTTP call: ``GET url`` answers ``{"replicas": n}``, ``POST
url`` with ``{"replicas": n, "reason": ...}`` asks for ``n`` (any 2xx is success)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx


class WebhookScaleTarget:
    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self._http = httpx.Client(
            headers=dict(headers or {}), timeout=timeout_s, transport=transport
        )

    def __str__(self) -> str:
        return f"webhook {self.url}"

    def get_replicas(self) -> int:
        response = self._http.get(self.url)
        response.raise_for_status()
        return int(response.json()["replicas"])

    def set_replicas(self, replicas: int, reason: str) -> None:
        response = self._http.post(self.url, json={"replicas": replicas, "reason": reason})
        response.raise_for_status()

    def close(self) -> None:
        self._http.close()
