"""The GPUs' power limit as a config knob (``power_limit_w``, whole watts), applied by the job's
agent through NVML (nvidia-ml-py, imported as ``pynvml``: ``pip install tuneloop-agent[power]``).

A released config with ``power_limit_w`` sets that limit on every GPU of this process
(``nvmlDeviceSetPowerManagementLimit``, what ``nvidia-smi -pl`` does) and verifies it by
reading back the limit the driver enforces (``nvmlDeviceGetEnforcedPowerLimit``); a config
without the key runs at the limit the agent found when it started. Setting a limit needs root
or CAP_SYS_ADMIN and a board with power management: where the driver refuses (no permission,
not supported, outside the board's range, or another limiter holding the GPU lower), every GPU
already changed is put back and :class:`PowerLimitRefused` says why, in one line the agent
reports to the control plane. On close the agent restores the limits it found, so a job never
leaves a GPU capped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

log = logging.getLogger(__name__)

POWER_LIMIT_KEY: Final = "power_limit_w"
"""The config key of the knob, in whole watts (``tuner.space.POWER_LIMIT_W``, the same text)."""


class PowerLimitRefused(RuntimeError):
    """The GPUs cannot run the requested power limit; nothing was changed."""


@dataclass(frozen=True, slots=True)
class GpuPowerRange:
    """One GPU's limits in whole watts: what the board allows (``min_w``..``max_w``), its
    default and the limit it had when the agent started (``found_w``)."""

    index: int
    min_w: int
    max_w: int
    default_w: int
    found_w: int


class GpuPowerLimit:
    """Sets and restores the power limit of this process's GPUs (``indices``: NVML indices;
    default every GPU NVML sees). ``nvml``: the NVML module (default: ``pynvml``)."""

    def __init__(self, indices: Sequence[int] | None = None, *, nvml: Any = None) -> None:
        self._indices = None if indices is None else list(indices)
        self._nvml = nvml
        self._handles: list[Any] = []
        self.ranges: tuple[GpuPowerRange, ...] = ()
        self.current_w: int | None = None
        """The limit this object set (``None``: the limits found are in place)."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> dict[str, Any]:
        """Open NVML and read each GPU's range; returns them as the agent registers them
        (``{"min_w", "max_w", "default_w", "found_w", "gpus"}``, the bounds all GPUs allow).
        :class:`PowerLimitRefused` when NVML cannot be opened or reports no power
        management."""
        nvml = self._module()
        try:
            nvml.nvmlInit()
            indices = self._indices
            if indices is None:
                indices = list(range(int(nvml.nvmlDeviceGetCount())))
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
            self.ranges = tuple(
                self._range(i, h) for i, h in zip(indices, self._handles, strict=True)
            )
        except nvml.NVMLError as exc:
            raise PowerLimitRefused(f"{POWER_LIMIT_KEY}: NVML: {_why(nvml, exc)}") from exc
        if not self.ranges:
            raise PowerLimitRefused(f"{POWER_LIMIT_KEY}: NVML sees no GPU")
        return self.describe()

    def describe(self) -> dict[str, Any]:
        return {
            "min_w": max(r.min_w for r in self.ranges),
            "max_w": min(r.max_w for r in self.ranges),
            "default_w": min(r.default_w for r in self.ranges),
            "found_w": [r.found_w for r in self.ranges],
            "gpus": [r.index for r in self.ranges],
        }

    def close(self) -> None:
        """Put back the limits found at start, then close NVML."""
        if not self._handles:
            return
        self.restore()
        nvml = self._module()
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            log.debug("nvmlShutdown failed", exc_info=True)
        self._handles = []

    # ------------------------------------------------------------------ the knob

    def apply_config(self, config: Mapping[str, Any]) -> None:
        """Run ``config``'s ``power_limit_w``, or the limits found when it has none."""
        watts = config.get(POWER_LIMIT_KEY)
        if watts is None:
            self.restore()
            return
        if isinstance(watts, bool) or not isinstance(watts, int) or watts <= 0:
            raise PowerLimitRefused(
                f"{POWER_LIMIT_KEY} must be a whole number of watts, got {watts!r}"
            )
        self.apply(watts)

    def apply(self, watts: int) -> None:
        """Set ``watts`` on every GPU and verify it is enforced; on any refusal, put back the
        GPUs already changed and raise :class:`PowerLimitRefused`."""
        if not self._handles:
            raise PowerLimitRefused(f"{POWER_LIMIT_KEY}: the GPUs' power limits are not open")
        if watts == self.current_w:
            return
        low = max(r.min_w for r in self.ranges)
        high = min(r.max_w for r in self.ranges)
        if not low <= watts <= high:
            raise PowerLimitRefused(
                f"{POWER_LIMIT_KEY} {watts} W is outside what the GPUs allow ({low}-{high} W)"
            )
        nvml = self._module()
        before = [self._limit_mw(h) for h in self._handles]
        changed: list[int] = []
        try:
            for position, handle in enumerate(self._handles):
                nvml.nvmlDeviceSetPowerManagementLimit(handle, watts * 1000)
                changed.append(position)
                enforced = int(nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
                if abs(enforced - watts * 1000) >= 1000:
                    raise PowerLimitRefused(
                        f"{POWER_LIMIT_KEY}: GPU {self.ranges[position].index} enforces "
                        f"{enforced / 1000:g} W after {watts} W was set (another limit holds "
                        "it lower)"
                    )
        except (nvml.NVMLError, PowerLimitRefused) as exc:
            self._put_back(changed, before)
            if isinstance(exc, PowerLimitRefused):
                raise
            index = self.ranges[len(changed)].index
            raise PowerLimitRefused(
                f"{POWER_LIMIT_KEY}: GPU {index} refused {watts} W: {_why(nvml, exc)}"
            ) from exc
        self.current_w = watts
        log.info("power limit %d W on GPUs %s", watts, [r.index for r in self.ranges])

    def restore(self) -> None:
        """Put back the limits found at start (errors logged: there is nothing else to do)."""
        if self.current_w is None or not self._handles:
            return
        self._put_back(range(len(self._handles)), [r.found_w * 1000 for r in self.ranges])
        self.current_w = None

    # ------------------------------------------------------------------ NVML

    def _module(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise PowerLimitRefused(
                    f"{POWER_LIMIT_KEY}: nvidia-ml-py is not installed "
                    "(pip install 'tuneloop-agent[power]')"
                ) from exc
            self._nvml = pynvml
        return self._nvml

    def _range(self, index: int, handle: Any) -> GpuPowerRange:
        nvml = self._module()
        low, high = nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
        return GpuPowerRange(
            index=index,
            min_w=_watts(low),
            max_w=_watts(high),
            default_w=_watts(nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)),
            found_w=_watts(self._limit_mw(handle)),
        )

    def _limit_mw(self, handle: Any) -> int:
        return int(self._module().nvmlDeviceGetPowerManagementLimit(handle))

    def _put_back(self, positions: Sequence[int] | range, milliwatts: Sequence[int]) -> None:
        nvml = self._module()
        for position in positions:
            try:
                nvml.nvmlDeviceSetPowerManagementLimit(
                    self._handles[position], milliwatts[position]
                )
            except nvml.NVMLError as exc:
                log.error(
                    "GPU %d: power limit not put back to %g W: %s",
                    self.ranges[position].index,
                    milliwatts[position] / 1000,
                    exc,
                )


def _watts(milliwatts: Any) -> int:
    return round(int(milliwatts) / 1000)


def _why(nvml: Any, exc: BaseException) -> str:
    """The driver's refusal in words a user acts on."""
    if isinstance(exc, nvml.NVMLError_NoPermission):
        return f"{exc} (setting a power limit needs root or CAP_SYS_ADMIN, as nvidia-smi -pl)"
    if isinstance(exc, nvml.NVMLError_NotSupported):
        return f"{exc} (this GPU has no settable power limit)"
    return str(exc)
