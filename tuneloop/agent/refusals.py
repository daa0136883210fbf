"""One clear line when the control plane refuses the agent's token.

Config polls, acknowledgements and the OTLP exporters all use the same token; a revoked or
mistyped one would otherwise show only as a job that never gets a config (the exporters log
their 401s in OpenTelemetry's words, once per batch). Said once, at ERROR, until an answer is
accepted again; then a new refusal is said again.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("tuneloop.agent")

_REFUSED = {
    401: "the control plane refused the agent's token (HTTP 401: missing, unknown, expired or "
    "revoked): check the token given to the agent (TUNELOOP_TOKEN)",
    403: "the control plane refused the agent's token for this job (HTTP 403: its role or "
    "project does not allow it): use an agent token of the job's project",
}


class TokenRefusals:
    """Remembers whether the current refusal was already logged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refused: int | None = None

    def saw(self, status: int, detail: str, request: str) -> None:
        """Note the answer ``status`` to ``request`` (``detail``: the server's message)."""
        if status in _REFUSED:
            with self._lock:
                first = self._refused != status
                self._refused = status
            if first:
                log.error(
                    "%s; %s stopped until it is accepted (%s)",
                    _REFUSED[status],
                    request,
                    detail[:200],
                )
        elif status < 400:
            with self._lock:
                self._refused = None


TOKEN_REFUSALS = TokenRefusals()
"""The process's one record: the config client and the exporters share a token."""
