"""The config subscription: a background thread long-polls the control plane for a newer
released config, another sends acknowledgements, and the training loop only ever reads what
they left (never waits on the network).

A job that loses the control plane keeps running on the config it has: the threads retry with
exponential backoff and jitter, and nothing changes in the job until a new version arrives.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from tuneloop.agent.client import ControlPlaneClient, ProtocolError, Released
from tuneloop.backoff import Backoff

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
"""The threads' backoff while the control plane is unreachable."""


@dataclass(frozen=True, slots=True)
class _Ack:
    version: int
    step: int | None


@dataclass(frozen=True, slots=True)
class _Refusal:
    version: int
    running: Mapping[str, Any]
    reason: str


class ConfigSubscription:
    """Receives released configs for one registered agent; thread-safe."""

    def __init__(
        self,
        client: ControlPlaneClient,
        register: Callable[[], tuple[int, Released | None]],
        *,
        running_version: int = 0,
        poll_timeout_s: float = 30.0,
    ) -> None:
        """``register`` is called (and retried) on the poll thread until it succeeds; it
        returns the agent id and the version the job should run."""
        self._client = client
        self._register = register
        self._poll_timeout_s = poll_timeout_s
        self._lock = threading.Lock()
        self._known_version = running_version  # the newest version seen (running or pending)
        self._pending: Released | None = None
        self._agent_id: int | None = None
        self._acks: queue.Queue[_Ack | _Refusal | None] = queue.Queue()
        self._stop = threading.Event()
        self.connected = threading.Event()
        """Set while the last exchange with the control plane succeeded."""
        self._threads = [
            threading.Thread(target=self._poll_loop, name="tuneloop-agent-poll", daemon=True),
            threading.Thread(target=self._ack_loop, name="tuneloop-agent-ack", daemon=True),
        ]

    @property
    def agent_id(self) -> int | None:
        return self._agent_id

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop: acknowledgements already queued are sent first (within the timeout). A
        long-poll in flight is not waited for: its daemon thread ends when it returns."""
        self._stop.set()
        self._acks.put(None)
        poll, ack = self._threads
        ack.join(timeout_s)
        poll.join(0.1)
        if not poll.is_alive():
            self._client.close()

    def pending(self) -> Released | None:
        """A released config newer than what the job runs, if one arrived (non-blocking)."""
        with self._lock:
            return self._pending

    def applied(self, version: int, step: int | None = None) -> None:
        """The job now runs ``version`` (from ``step``): acknowledged in the background."""
        with self._lock:
            if self._pending is not None and self._pending.version <= version:
                self._pending = None
            self._known_version = max(self._known_version, version)
        self._acks.put(_Ack(version, step))

    def refused(self, version: int, running: Mapping[str, Any], reason: str) -> None:
        """The job cannot run released ``version`` and keeps ``running``: reported in the
        background as an observed config acknowledging ``version`` with status failed."""
        with self._lock:
            if self._pending is not None and self._pending.version <= version:
                self._pending = None
            self._known_version = max(self._known_version, version)
        self._acks.put(_Refusal(version, dict(running), reason))

    def _offer(self, released: Released | None) -> None:
        if released is None:
            return
        with self._lock:
            if released.version > self._known_version:
                self._known_version = released.version
                self._pending = released

    def _poll_loop(self) -> None:
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while not self._stop.is_set():
            try:
                if self._agent_id is None:
                    agent_id, released = self._register()
                    self._agent_id = agent_id
                    self._offer(released)
                    self._set_connected(True)
                with self._lock:
                    after = self._known_version
                released = self._client.next_config(
                    after, timeout_s=self._poll_timeout_s, agent_id=self._agent_id
                )
                self._offer(released)
                self._set_connected(True)
                backoff.reset()
            except (httpx.HTTPError, ProtocolError, OSError, RuntimeError) as exc:
                if self._stop.is_set():
                    return  # the client was closed under a long-poll: that is how it ends
                self._set_connected(False, exc)
                delay = backoff.next_delay()
                if isinstance(exc, ProtocolError) and exc.status < 500:
                    delay = max(delay, 10.0)  # refused: an operator has to act; ask less often
                self._stop.wait(delay)

    def _ack_loop(self) -> None:
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        item = None
        while True:
            if item is None:
                item = self._acks.get()
                if item is None:
                    return
            version = item.version
            agent_id = self._agent_id
            try:
                if agent_id is None:
                    raise ConnectionError("not registered yet")
                if isinstance(item, _Refusal):
                    self._client.report_failed(version, item.running, item.reason)
                else:
                    self._client.ack(agent_id, version, item.step)
                item = None
                backoff.reset()
            except ProtocolError as exc:
                if exc.status >= 500:
                    self._stop.wait(backoff.next_delay())
                    continue
                log.error("acknowledgement of version %d refused: %s", version, exc)
                item = None
            except (httpx.HTTPError, OSError) as exc:
                self._set_connected(False, exc)
                if self._stop.is_set():
                    log.warning("version %d not acknowledged: control plane unreachable", version)
                    return
                self._stop.wait(backoff.next_delay())

    def _set_connected(self, ok: bool, error: BaseException | None = None) -> None:
        if ok and not self.connected.is_set():
            log.info("control plane reachable")
            self.connected.set()
        elif not ok and (self.connected.is_set() or error is not None):
            if self.connected.is_set():
                log.warning("control plane unreachable, running on the current config: %s", error)
            self.connected.clear()
