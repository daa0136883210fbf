"""Reads series back through the query API, as a user of tuneloop would."""

from __future__ import annotations

import time
from typing import Any

import httpx


class QueryApi:
    def __init__(self, base_url: str, token: str, project: str) -> None:
        self.client = httpx.Client(
            base_url=f"{base_url}/api/v1/projects/{project}",
            headers={"Authorization": f"Bearer {token}"},
        )

    def latest(self, metric: str, **labels: str) -> dict[str, str]:
        """``{le-or-phase-or-"": value}`` of the newest samples of ``metric``."""
        params: dict[str, Any] = {
            "metric": metric,
            "match": [f'{k}="{v}"' for k, v in labels.items()],
        }
        response = self.client.get("/query/latest", params=params)
        assert response.status_code == 200, response.text
        return {
            sample["metric"].get("le", sample["metric"].get("phase", "")): sample["value"][1]
            for sample in response.json()["result"]
        }

    def quantile(self, metric: str, q: float) -> list[str]:
        now = int(time.time())
        # One-minute windows: the increase between the two exports lands in exactly one.
        params: dict[str, Any] = {
            "metric": metric,
            "q": q,
            "start": now - 600,
            "end": now + 60,
            "step": 60,
        }
        response = self.client.get("/histogram_quantile", params=params)
        assert response.status_code == 200, response.text
        return [value for series in response.json()["result"] for _, value in series["values"]]
