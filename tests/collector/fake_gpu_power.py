"""A GPU's power management as NVML shows it, for ``FakeNvml`` (``tests/collector/fakes.py``):
the power limit a job's agent sets and rolls back, and the energy counter the collector reads,
which integrates the power the GPU draws under that limit, so that samples per joule is a real
function of the limit.

What it follows of the real library (nvml.h's reference, "Device Queries" / "Device Commands",
and nvidia-ml-py's ``pynvml.py``, which wraps each call and raises ``NVMLError`` subclasses by
return code):

- ``nvmlDeviceGetPowerManagementLimitConstraints(h) -> [min_mW, max_mW]``,
  ``nvmlDeviceGetPowerManagementDefaultLimit(h) -> mW``,
  ``nvmlDeviceGetPowerManagementLimit(h) -> mW`` (the limit set, "may be different from the
  enforced limit if multiple limits are set"), ``nvmlDeviceGetEnforcedPowerLimit(h) -> mW``
  (the limit the driver enforces, the minimum of every limiter), all in milliwatts.
- ``nvmlDeviceSetPowerManagementLimit(h, mW)``: "requires root/admin permissions"
  (``NVML_ERROR_NO_PERMISSION`` otherwise; ``nvidia-smi -pl`` says "Insufficient
  Permissions"), ``NVML_ERROR_INVALID_ARGUMENT`` outside the constraints,
  ``NVML_ERROR_NOT_SUPPORTED`` on a board without power management (many consumer and MIG
  child devices). The limit lasts until the driver unloads (it is not persistent).
- ``nvmlDeviceGetTotalEnergyConsumption(h) -> mJ`` since the driver last loaded (Volta and
  later), ``nvmlDeviceGetPowerUsage(h) -> mW``.

The draw follows the workload's demand up to the enforced limit; time comes from ``clock``
(seconds, monotonic), so a test advances it by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml


@dataclass
class FakeGpuPower:
    """One board's power management. ``refuse_with``: the NVML return code every set gets
    (``NVML_ERROR_NO_PERMISSION`` for a process without root or CAP_SYS_ADMIN,
    ``NVML_ERROR_NOT_SUPPORTED``); ``capped_mw``: another limiter below which the enforced limit
    stays whatever is set (an out-of-band limit of the node's BMC, say)."""

    min_mw: int = 200_000
    max_mw: int = 700_000
    default_mw: int = 700_000
    demand_w: float = 650.0
    """What the workload draws with no limit in the way."""
    refuse_with: int | None = None
    capped_mw: int | None = None
    clock: Callable[[], float] = time.monotonic
    limit_mw: int = field(init=False)
    sets: list[int] = field(default_factory=list)
    """Every limit set, in order (milliwatts)."""
    _energy_mj: float = field(init=False, default=9_312_884_417.0)
    _since: float = field(init=False)

    def __post_init__(self) -> None:
        self.limit_mw = self.default_mw
        self._since = self.clock()

    def enforced_mw(self) -> int:
        return self.limit_mw if self.capped_mw is None else min(self.limit_mw, self.capped_mw)

    def draw_w(self) -> float:
        return min(self.demand_w, self.enforced_mw() / 1000.0)

    def energy_mj(self) -> int:
        self._integrate()
        return int(self._energy_mj)

    def set_limit(self, milliwatts: int) -> None:
        if self.refuse_with is not None:
            raise pynvml.NVMLError(self.refuse_with)
        if not self.min_mw <= milliwatts <= self.max_mw:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._integrate()  # the energy so far was drawn under the old limit
        self.limit_mw = milliwatts
        self.sets.append(milliwatts)

    def _integrate(self) -> None:
        now = self.clock()
        self._energy_mj += self.draw_w() * 1000.0 * (now - self._since)
        self._since = now


class ManualClock:
    """Seconds that pass only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
