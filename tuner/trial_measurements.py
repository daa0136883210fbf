"""What a trial stores in ``Trial.measurements``: the one reader and writer of that JSON column.

The column holds ``{"context": {..}, "stderr": float | None, "reason": str, "data": {..}}``:
the ask's context, the told value's standard error, why a trial is infeasible or failed, and
the teller's raw measurements. ``data`` is open (an agent tells whatever it measured); the keys
the tuner itself writes there and reads back are named here, with typed readers.

Pure (no I/O): rows written by any earlier version read back, whatever they lack or add.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

ACK_TIMEOUT_KEY: Final = "ack_timeout"
"""Key of ``data`` marking a failed trial the job never acknowledged."""
WAITED_S_KEY: Final = "waited_s"
"""Key of ``data``: seconds the loop waited for the acknowledgement before it gave up."""
GPU_MEMORY_KEY: Final = "gpu_memory"
"""Key of ``data`` holding the trial's framebuffer reading (``readings.GpuMemory.to_dict()``),
which the memory bound is fitted on."""
GPU_POWER_KEY: Final = "gpu_power"
"""Key of ``data`` holding a per-joule trial's energy reading (``readings.GpuPower.to_dict()``):
the joules its value was computed from."""


@dataclass(frozen=True)
class TrialMeasurements:
    """A trial's stored measurements; build with :meth:`running` or :meth:`from_json`."""

    context: Mapping[str, Any] = field(default_factory=dict)
    stderr: float | None = None
    reason: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def running(cls, context: Mapping[str, Any] | None = None) -> TrialMeasurements:
        """A trial just asked: its context, nothing told yet."""
        return cls(context=dict(context or {}))

    @classmethod
    def from_json(cls, raw: object) -> TrialMeasurements:
        """Read a stored column; a missing or malformed key reads as its default and unknown
        keys are ignored (``tell`` never wrote any), so older rows read as they meant."""
        if not isinstance(raw, Mapping):
            return cls()
        return cls(
            context=_mapping(raw.get("context")),
            stderr=_finite_or_none(raw.get("stderr")),
            reason=str(raw.get("reason") or ""),
            data=_mapping(raw.get("data")),
        )

    def to_json(self) -> dict[str, Any]:
        # New dicts every time: the JSON column only notices reassignment, never an edit.
        return {
            "context": dict(self.context),
            "stderr": self.stderr,
            "reason": self.reason,
            "data": dict(self.data),
        }

    def told(
        self, *, stderr: float | None, reason: str, data: Mapping[str, Any]
    ) -> TrialMeasurements:
        """The same trial after its result was told (the ask's context stays)."""
        return replace(self, stderr=stderr, reason=reason, data=dict(data))

    @property
    def ack_timed_out(self) -> bool:
        return bool(self.data.get(ACK_TIMEOUT_KEY))

    @property
    def waited_s(self) -> float:
        return _finite_or_none(self.data.get(WAITED_S_KEY)) or 0.0

    @property
    def gpu_memory(self) -> Mapping[str, Any] | None:
        reading = self.data.get(GPU_MEMORY_KEY)
        return reading if isinstance(reading, Mapping) else None


def _mapping(value: object) -> Mapping[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _finite_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


__all__ = [
    "ACK_TIMEOUT_KEY",
    "GPU_MEMORY_KEY",
    "GPU_POWER_KEY",
    "WAITED_S_KEY",
    "TrialMeasurements",
]
