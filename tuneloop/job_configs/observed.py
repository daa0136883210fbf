"""What an observed config says besides the job's settings: the desired version it
acknowledges, whether the job runs it, and why not. Stored in typed columns of
``job_configs`` (``acknowledged_version``, ``status``, ``reason``).

Agents may still send them as keys of the observed config's body (the wire format before
migration 0009): :func:`split_wire_body` takes them out, so the stored ``config`` holds only
the job's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast, get_args

from tuneloop.errors import Conflict, InvalidInput

ObservedStatus = Literal["running", "oom", "failed"]
OBSERVED_STATUSES: Final[tuple[ObservedStatus, ...]] = get_args(ObservedStatus)
FAILED_STATUSES: Final[tuple[ObservedStatus, ...]] = ("oom", "failed")
"""The job could not run the configuration (``oom``: out of memory)."""

ACK_KEY: Final = "desired_version"
"""Wire key of an observed body: the desired version the job now runs."""
STATUS_KEY: Final = "status"
"""Wire key of an observed body: one of :data:`OBSERVED_STATUSES`."""
REASON_KEY: Final = "reason"
"""Wire key of an observed body: why the job could not run it."""
WIRE_KEYS: Final = (ACK_KEY, STATUS_KEY, REASON_KEY)


class UnknownVersion(Conflict):
    """An agent acknowledged a version that was never released to its job."""


@dataclass(frozen=True, slots=True)
class ObservedReport:
    """The typed part of an observed config."""

    acknowledged_version: int | None = None
    status: ObservedStatus = "running"
    reason: str = ""


def split_wire_body(
    body: Mapping[str, Any],
    *,
    acknowledged_version: int | None = None,
    status: str | None = None,
    reason: str | None = None,
) -> tuple[dict[str, Any], ObservedReport]:
    """The job's settings and the typed report of an observed body, from the wire keys in
    ``body`` or the typed fields given beside it. :class:`InvalidInput` when a value has the
    wrong type or the two places disagree; :class:`UnknownVersion` for an acknowledgement of
    something no desired version is numbered (no release has that number either)."""
    settings = {k: v for k, v in body.items() if k not in WIRE_KEYS}
    acked = _one(ACK_KEY, body, acknowledged_version)
    if acked is not None and (isinstance(acked, bool) or not isinstance(acked, int) or acked < 1):
        raise UnknownVersion(f"{ACK_KEY} {acked!r} was never released to this job")
    said = _one(STATUS_KEY, body, status)
    if said is not None and said not in OBSERVED_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(OBSERVED_STATUSES)}, got {said!r}")
    why = _one(REASON_KEY, body, reason)
    if why is not None and not isinstance(why, str):
        raise InvalidInput(f"reason must be text, got {why!r}")
    report = ObservedReport(
        acknowledged_version=acked,
        status=cast(ObservedStatus, said or "running"),
        reason=why or "",
    )
    return settings, report


def _one(key: str, body: Mapping[str, Any], typed: Any) -> Any:
    """The value given under ``key`` in the body or as the typed field; both only if equal."""
    if key not in body:
        return typed
    if typed is not None and typed != body[key]:
        raise InvalidInput(f"{key} is {typed!r} in the request and {body[key]!r} in the config")
    return body[key]
