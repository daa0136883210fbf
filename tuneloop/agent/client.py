"""The agent's HTTP client for the control plane's agent protocol (httpx only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tuneloop import __version__
from tuneloop.agent.refusals import TOKEN_REFUSALS


class ProtocolError(RuntimeError):
    """The control plane refused a request (4xx): retrying the same request will not help."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Released:
    """A desired config version released to the job."""

    version: int
    config: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One rank of the job, the UUIDs of its GPUs (none on a CPU job) and its host (``None``:
    the registering process's)."""

    rank: int
    gpu_uuids: Sequence[str] = field(default_factory=tuple)
    host: str | None = None


class ControlPlaneClient:
    """``register``, ``next_config`` (long-poll) and ``ack`` for one job.

    Raises :class:`ProtocolError` on 4xx answers and ``httpx.HTTPError`` (or
    :class:`ProtocolError` with status >= 500) on transport problems and 5xx, which callers
    retry with backoff.
    """

    def __init__(
        self,
        url: str,
        token: str,
        project: str,
        job: str,
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._jobs = f"{url.rstrip('/')}/api/v1/projects/{project}/jobs"
        self._job = job
        self._base = f"{self._jobs}/{job}"
        self._timeout_s = timeout_s
        self._http = httpx.Client(
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": f"tuneloop-agent/{__version__}",
            },
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def _check(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                detail = str(response.json().get("detail"))
            except ValueError:
                detail = response.text[:200]
            TOKEN_REFUSALS.saw(response.status_code, detail, "config updates")
            raise ProtocolError(response.status_code, detail)
        TOKEN_REFUSALS.saw(response.status_code, "", "config updates")
        return response.json() if response.content else None

    def ensure_job(self) -> None:
        """Create the job if it does not exist yet (agents may register their own jobs)."""
        response = self._http.get(self._base)
        if response.status_code == 404:
            created = self._http.post(self._jobs, json={"name": self._job, "status": "running"})
            if created.status_code != 409:  # 409: created meanwhile by another process
                self._check(created)
            return
        self._check(response)

    def register(
        self,
        *,
        host: str,
        world_size: int,
        ranks: Sequence[RankInfo],
        config: Mapping[str, Any] | None,
        pid: int | None = None,
        details: Mapping[str, Any] | None = None,
        knobs: Sequence[Mapping[str, Any]] = (),
    ) -> tuple[int, Released | None]:
        """Register; returns the agent id and the version the job should run, if any.
        ``knobs``: the job's knob declarations (:meth:`tuneloop.agent.knobs.Knob.declaration`)."""
        body = {
            "host": host,
            "pid": pid,
            "world_size": world_size,
            "ranks": [_rank(r) for r in ranks],
            "config": dict(config) if config is not None else None,
            "details": dict(details or {}),
            "knobs": [dict(k) for k in knobs],
        }
        data = self._check(self._http.post(f"{self._base}/agents", json=body))
        released = data.get("released")
        return int(data["id"]), _released(released) if released else None

    def next_config(
        self, after: int, *, timeout_s: float, agent_id: int | None = None
    ) -> Released | None:
        """The released version if newer than ``after``, waiting up to ``timeout_s``."""
        params: dict[str, Any] = {"after": after, "timeout": timeout_s}
        if agent_id is not None:
            params["agent"] = agent_id
        response = self._http.get(
            f"{self._base}/config/next",
            params=params,
            timeout=httpx.Timeout(self._timeout_s, read=timeout_s + self._timeout_s),
        )
        if response.status_code == 204:
            return None
        return _released(self._check(response))

    def ack(self, agent_id: int, version: int, step: int | None = None) -> None:
        body = {"agent_id": agent_id, "version": version, "step": step}
        self._check(self._http.post(f"{self._base}/config/ack", json=body))

    def report_failed(self, version: int, running: Mapping[str, Any], reason: str) -> None:
        """The job could not run released ``version`` and runs ``running``: an observed
        config acknowledging ``version`` with status failed and ``reason``."""
        body = {
            "config": dict(running),
            "source": "agent",
            "acknowledged_version": version,
            "status": "failed",
            "reason": reason[:2000],
        }
        self._check(self._http.post(f"{self._base}/config/observed", json=body))


def _released(data: Mapping[str, Any]) -> Released:
    return Released(int(data["version"]), dict(data["config"]))


def _rank(rank: RankInfo) -> dict[str, Any]:
    body: dict[str, Any] = {"rank": rank.rank, "gpu_uuids": list(rank.gpu_uuids)}
    if rank.host is not None:
        body["host"] = rank.host
    return body
