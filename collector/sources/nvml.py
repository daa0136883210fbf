"""GPU metrics through NVML (nvidia-ml-py, imported as ``pynvml``) where no DCGM host engine runs.

Series carry dcgm-exporter's names and labels for every field NVML can give, with DCGM's units:
framebuffer in MiB, power in W, energy in mJ (a counter), PCIe throughput in bytes/s. A GPU in
MIG mode is reported whole (its device-level fields) plus per MIG instance where NVML answers
per instance (framebuffer), the instances labelled GPU_I_PROFILE/GPU_I_ID.

Failure policy: a field NVML answers NotSupported (or NoPermission, or a binding too old to have
the function) is remembered per GPU and not asked again. Any other NVML error skips that GPU for
this poll and is counted in ``gpu_errors``; the other GPUs are returned. Only when every GPU
failed does ``collect`` raise, so the runner reports the source as down.
"""

from __future__ import annotations

import ctypes
import logging
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from collector.points import Point
from collector.sources.gpu_labels import (
    XID_METRIC,
    GpuIdentity,
    MigIdentity,
    as_text,
    device_name,
    gpu_labels,
    mig_profile_from_name,
    xid_attributes,
)
from tuneloop.storage.timeseries.types import SeriesKind

log = logging.getLogger(__name__)

GAUGE, COUNTER = SeriesKind.GAUGE, SeriesKind.COUNTER
_MIB = 1 << 20
_ALL_LINKS = 0xFFFFFFFF  # NVML field scopeId: summed over every NVLink
_MAX_EVENTS_PER_POLL = 1024
_DRIVER_VERSION_LABEL = "DCGM_FI_DRIVER_VERSION"

# nvmlFieldValue_t.valueType -> member of the value union
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be initialised (no driver, no library)."""


class NvmlCollectError(RuntimeError):
    """Every GPU failed this poll."""


class _MissingFunction(Exception):
    """The installed bindings predate an NVML function; treated like NotSupported."""


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any
    identity: GpuIdentity
    stale: bool = False  # its last poll failed: look its handle up again before the next
    xid_registered: bool = False


Emit = Callable[[str, float, SeriesKind], None]


class NvmlSource:
    name = "nvml"

    def __init__(self, nvml: Any = None, hostname: str | None = None) -> None:
        self._nvml = nvml
        self._hostname = hostname or socket.gethostname()
        self._initialized = False
        self._device_count = 0
        self._gpus: dict[int, _Gpu] = {}
        self._unsupported: dict[str, set[str]] = {}
        self._driver_version: str | None = None
        self._events: Any = None
        self._xid_capable: set[str] = set()  # UUIDs that ever registered for XID events
        self._last_xid: dict[str, int] = {}
        self.gpu_errors: Counter[str] = Counter()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        nvml = self._module()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailableError(f"NVML initialisation failed: {exc}") from exc
        self._initialized = True
        try:
            self._driver_version = as_text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            self._driver_version = None
        self._discover()

    def collect(self, now: datetime) -> list[Point]:
        if not self._initialized:
            self.start()
        nvml = self._module()
        if len(self._gpus) < self._device_count or any(g.stale for g in self._gpus.values()):
            self._discover()  # retry GPUs that could not be read: fresh handles
        self._drain_xid_events()
        points: list[Point] = []
        failed = 0
        for gpu in self._gpus.values():
            try:
                points.extend(self._gpu_points(gpu, now))
            except nvml.NVMLError as exc:
                failed += 1
                gpu.stale = True
                self.gpu_errors[gpu.identity.uuid] += 1
                log.warning("NVML GPU %s (%s): %s; skipped", gpu.index, gpu.identity.uuid, exc)
        points.extend(self._xid_points(now))
        if self._gpus and failed == len(self._gpus):
            raise NvmlCollectError(f"all {failed} GPUs failed to report through NVML")
        return points

    def shutdown(self) -> None:
        if not self._initialized:
            return
        nvml = self._module()
        if self._events is not None:
            try:
                nvml.nvmlEventSetFree(self._events)
            except nvml.NVMLError:
                log.debug("nvmlEventSetFree failed", exc_info=True)
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            log.debug("nvmlShutdown failed", exc_info=True)
        self._initialized = False
        self._events = None
        self._gpus.clear()

    # -- discovery ---------------------------------------------------------------------------

    def _module(self) -> Any:
        if self._nvml is None:
            import pynvml

            self._nvml = pynvml
        return self._nvml

    def _discover(self) -> None:
        nvml = self._module()
        try:
            self._device_count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise NvmlCollectError(f"NVML cannot count GPUs: {exc}") from exc
        for index in range(self._device_count):
            known = self._gpus.get(index)
            if known is not None and not known.stale:
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                self._gpus[index] = _Gpu(index, handle, self._identity(index, handle))
            except nvml.NVMLError as exc:
                # A GPU known before stays listed (stale), so its XIDs are still reported.
                self.gpu_errors[f"index:{index}"] += 1
                log.warning("NVML GPU %d: identity unreadable (%s); retrying next poll", index, exc)
        self._register_xid_events()

    def _identity(self, index: int, handle: Any) -> GpuIdentity:
        nvml = self._module()
        try:
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except nvml.NVMLError_NotSupported:
            minor = index  # no /dev/nvidiaN minor (e.g. Windows): fall back to the index
        return GpuIdentity(
            gpu=str(index),
            uuid=as_text(nvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=as_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            device=device_name(minor),
            model_name=as_text(nvml.nvmlDeviceGetName(handle)),
        )

    # -- XID events --------------------------------------------------------------------------

    def _register_xid_events(self) -> None:
        nvml = self._module()
        event_type = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if event_type is None:
            return
        if self._events is None:
            try:
                self._events = nvml.nvmlEventSetCreate()
            except nvml.NVMLError as exc:
                log.info("NVML event set unavailable (%s); no XID events", exc)
                return
        for gpu in self._gpus.values():
            if gpu.xid_registered or gpu.stale:
                continue
            gpu.xid_registered = True  # tried once per handle, supported or not
            try:
                nvml.nvmlDeviceRegisterEvents(gpu.handle, event_type, self._events)
            except nvml.NVMLError as exc:
                log.info("NVML GPU %d: XID events unavailable (%s)", gpu.index, exc)
                continue
            self._xid_capable.add(gpu.identity.uuid)

    def _drain_xid_events(self) -> None:
        """Read the XIDs that arrived since the last poll, without blocking (timeout 0)."""
        nvml = self._module()
        if self._events is None:
            return
        event_type = int(nvml.nvmlEventTypeXidCriticalError)
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError_Timeout:
                return
            except nvml.NVMLError as exc:
                log.warning("NVML event wait failed: %s", exc)
                return
            if not int(data.eventType) & event_type:
                continue
            gpu = self._gpu_for_handle(data.device)
            if gpu is not None:
                self._last_xid[gpu.identity.uuid] = int(data.eventData)

    def _gpu_for_handle(self, handle: Any) -> _Gpu | None:
        # ctypes device pointers compare by object, not address: compare addresses, and fall
        # back to identity for non-ctypes handles.
        address = _address(handle)
        for gpu in self._gpus.values():
            if gpu.handle is handle or (address is not None and _address(gpu.handle) == address):
                return gpu
        return None

    def _xid_points(self, now: datetime) -> list[Point]:
        points = []
        for gpu in self._gpus.values():
            if gpu.identity.uuid not in self._xid_capable:
                continue
            code = self._last_xid.get(gpu.identity.uuid, 0)
            labels = gpu_labels(
                gpu.identity,
                self._hostname,
                extra=self._extra_labels(),
                attributes=xid_attributes(code),
            )
            points.append(Point(XID_METRIC, labels, now, float(code), GAUGE))
        return points

    # -- per-GPU fields ----------------------------------------------------------------------

    def _extra_labels(self) -> dict[str, str]:
        return {_DRIVER_VERSION_LABEL: self._driver_version} if self._driver_version else {}

    def _fn(self, name: str) -> Any:
        function = getattr(self._module(), name, None)
        if function is None:
            raise _MissingFunction(name)
        return function

    def _read(self, key: str, field: str, thunk: Callable[[], Any]) -> Any:
        """One field of one GPU; None when unsupported (remembered, not asked again)."""
        nvml = self._module()
        skipped = self._unsupported.setdefault(key, set())
        if field in skipped:
            return None
        unsupported = (
            nvml.NVMLError_NotSupported,
            nvml.NVMLError_FunctionNotFound,
            nvml.NVMLError_NoPermission,
            _MissingFunction,
        )
        try:
            return thunk()
        except unsupported:
            skipped.add(field)
            return None

    def _gpu_points(self, gpu: _Gpu, now: datetime) -> list[Point]:
        points: list[Point] = []
        labels = gpu_labels(gpu.identity, self._hostname, extra=self._extra_labels())

        def emit(metric: str, value: float, kind: SeriesKind = GAUGE) -> None:
            points.append(Point(metric, labels, now, float(value), kind))

        key = gpu.identity.uuid
        self._activity(key, gpu.handle, emit)
        self._memory(key, gpu.handle, emit)
        self._power_thermal_clocks(key, gpu.handle, emit)
        self._interconnect(key, gpu.handle, emit)
        self._errors(key, gpu.handle, emit)
        points.extend(self._mig_points(gpu, now))
        return points

    def _call(self, key: str, field: str, function: str, *args: Any, **kwargs: Any) -> Any:
        """``nvml.<function>(*args)`` as field ``field`` of GPU ``key``, through ``_read``."""
        return self._read(key, field, lambda: self._fn(function)(*args, **kwargs))

    def _activity(self, key: str, h: Any, emit: Emit) -> None:
        util = self._call(key, "utilization", "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            emit("DCGM_FI_DEV_GPU_UTIL", util.gpu, GAUGE)
            emit("DCGM_FI_DEV_MEM_COPY_UTIL", util.memory, GAUGE)
        # Each returns [utilization %, sampling period us].
        encoder = self._call(key, "encoder", "nvmlDeviceGetEncoderUtilization", h)
        if encoder is not None:
            emit("DCGM_FI_DEV_ENC_UTIL", encoder[0], GAUGE)
        decoder = self._call(key, "decoder", "nvmlDeviceGetDecoderUtilization", h)
        if decoder is not None:
            emit("DCGM_FI_DEV_DEC_UTIL", decoder[0], GAUGE)

    def _memory_info(self, key: str, h: Any) -> Any:
        # v2 splits "reserved" out of "used", as DCGM's FB_USED/FB_RESERVED do.
        version = getattr(self._module(), "nvmlMemory_v2", None)
        if version is not None:
            info = self._call(key, "memory_v2", "nvmlDeviceGetMemoryInfo", h, version=version)
            if info is not None:
                return info
        return self._call(key, "memory", "nvmlDeviceGetMemoryInfo", h)

    def _memory(self, key: str, h: Any, emit: Emit) -> None:
        info = self._memory_info(key, h)
        if info is None:
            return
        emit("DCGM_FI_DEV_FB_TOTAL", int(info.total) // _MIB, GAUGE)
        emit("DCGM_FI_DEV_FB_FREE", int(info.free) // _MIB, GAUGE)
        emit("DCGM_FI_DEV_FB_USED", int(info.used) // _MIB, GAUGE)
        reserved = getattr(info, "reserved", None)
        if reserved is not None:
            emit("DCGM_FI_DEV_FB_RESERVED", int(reserved) // _MIB, GAUGE)

    def _power_thermal_clocks(self, key: str, h: Any, emit: Emit) -> None:
        nvml = self._module()
        milliwatts = self._call(key, "power", "nvmlDeviceGetPowerUsage", h)
        if milliwatts is not None:
            emit("DCGM_FI_DEV_POWER_USAGE", int(milliwatts) / 1000.0, GAUGE)
        energy = self._call(key, "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        if energy is not None:
            emit("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", energy, COUNTER)  # mJ since driver load
        temp = self._call(key, "gpu_temp", "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            emit("DCGM_FI_DEV_GPU_TEMP", temp, GAUGE)
        mem_temp = self._read(
            key, "memory_temp", lambda: self._field_values(h, [nvml.NVML_FI_DEV_MEMORY_TEMP])[0]
        )
        if mem_temp is not None:
            emit("DCGM_FI_DEV_MEMORY_TEMP", mem_temp, GAUGE)
        sm_clock = self._call(key, "sm_clock", "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM)
        if sm_clock is not None:
            emit("DCGM_FI_DEV_SM_CLOCK", sm_clock, GAUGE)
        mem_clock = self._call(key, "mem_clock", "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM)
        if mem_clock is not None:
            emit("DCGM_FI_DEV_MEM_CLOCK", mem_clock, GAUGE)
        reasons = self._read(key, "clock_events", lambda: self._clock_event_reasons(h))
        if reasons is not None:
            emit("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", reasons, GAUGE)

    def _clock_event_reasons(self, h: Any) -> int:
        # Renamed from "throttle reasons" in NVML 12.2; the old entry point remains.
        nvml = self._module()
        function = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if function is None:
            function = self._fn("nvmlDeviceGetCurrentClocksThrottleReasons")
        return int(function(h))

    def _interconnect(self, key: str, h: Any, emit: Emit) -> None:
        nvml = self._module()
        # NVML: KB/s over a 20 ms window; DCGM's PROF field is bytes/s.
        for field, counter, metric in (
            ("pcie_tx", nvml.NVML_PCIE_UTIL_TX_BYTES, "DCGM_FI_PROF_PCIE_TX_BYTES"),
            ("pcie_rx", nvml.NVML_PCIE_UTIL_RX_BYTES, "DCGM_FI_PROF_PCIE_RX_BYTES"),
        ):
            kbps = self._call(key, field, "nvmlDeviceGetPcieThroughput", h, counter)
            if kbps is not None:
                emit(metric, int(kbps) * 1024, GAUGE)
        replays = self._call(key, "pcie_replay", "nvmlDeviceGetPcieReplayCounter", h)
        if replays is not None:
            emit("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", replays, COUNTER)
        links = [
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        ]
        nvlink = self._read(key, "nvlink", lambda: self._field_values(h, links))
        if nvlink is not None:
            # KiB of payload, both directions, all links: cumulative since driver load.
            emit("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", sum(nvlink), COUNTER)

    def _errors(self, key: str, h: Any, emit: Emit) -> None:
        nvml = self._module()
        corrected, uncorrected = 0, 1  # NVML_MEMORY_ERROR_TYPE_*: single / double bit
        for field, error_type, counter_type, metric in (
            ("ecc_sbe_vol", corrected, nvml.NVML_VOLATILE_ECC, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
            ("ecc_dbe_vol", uncorrected, nvml.NVML_VOLATILE_ECC, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
            ("ecc_sbe_agg", corrected, nvml.NVML_AGGREGATE_ECC, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
            ("ecc_dbe_agg", uncorrected, nvml.NVML_AGGREGATE_ECC, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
        ):
            count = self._call(
                key, field, "nvmlDeviceGetTotalEccErrors", h, error_type, counter_type
            )
            if count is not None:
                emit(metric, count, COUNTER)
        # Page retirement (pre-Ampere); cause 0/1 = multiple single-bit / double-bit ECC.
        for field, cause, metric in (
            ("retired_sbe", 0, "DCGM_FI_DEV_RETIRED_SBE"),
            ("retired_dbe", 1, "DCGM_FI_DEV_RETIRED_DBE"),
        ):
            pages = self._call(key, field, "nvmlDeviceGetRetiredPages", h, cause)
            if pages is not None:
                emit(metric, len(pages), COUNTER)
        pending = self._call(key, "retired_pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
        if pending is not None:
            emit("DCGM_FI_DEV_RETIRED_PENDING", pending, GAUGE)
        # Row remapping (Ampere and later): (correctable, uncorrectable, pending, failed).
        rows = self._call(key, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            correctable, uncorrectable, is_pending, failed = rows
            emit("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", correctable, COUNTER)
            emit("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", uncorrectable, COUNTER)
            emit("DCGM_FI_DEV_ROW_REMAP_PENDING", is_pending, GAUGE)
            emit("DCGM_FI_DEV_ROW_REMAP_FAILURE", failed, GAUGE)

    def _field_values(self, h: Any, field_ids: list[Any]) -> list[float]:
        """nvmlDeviceGetFieldValues, raising the per-field NVML error so NotSupported is
        remembered like any other unsupported call."""
        nvml = self._module()
        values = self._fn("nvmlDeviceGetFieldValues")(h, field_ids)
        numbers: list[float] = []
        for value in values:
            if int(value.nvmlReturn) != 0:
                raise nvml.NVMLError(int(value.nvmlReturn))
            member = _VALUE_MEMBERS.get(int(value.valueType))
            if member is None:
                raise _MissingFunction(f"field value type {value.valueType}")
            numbers.append(float(getattr(value.value, member)))
        return numbers

    # -- MIG ---------------------------------------------------------------------------------

    def _mig_points(self, gpu: _Gpu, now: datetime) -> list[Point]:
        nvml = self._module()
        key = gpu.identity.uuid
        mode = self._call(key, "mig_mode", "nvmlDeviceGetMigMode", gpu.handle)
        if mode is None or int(mode[0]) != int(nvml.NVML_DEVICE_MIG_ENABLE):
            return []
        points: list[Point] = []
        try:
            count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))
            for position in range(count):
                try:
                    mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, position)
                except nvml.NVMLError_NotFound:
                    continue  # slot without an instance
                points.extend(self._mig_instance_points(gpu, mig_handle, now))
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError as exc:
            # A MIG query failing must not cost the whole GPU its device-level series.
            self.gpu_errors[f"{key}/mig"] += 1
            log.warning("NVML GPU %d: MIG instances unreadable: %s", gpu.index, exc)
        return points

    def _mig_instance_points(self, gpu: _Gpu, mig_handle: Any, now: datetime) -> list[Point]:
        nvml = self._module()
        instance_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig_handle))
        profile = mig_profile_from_name(as_text(nvml.nvmlDeviceGetName(mig_handle)))
        mig = MigIdentity(profile=profile, instance_id=str(instance_id))
        labels = gpu_labels(gpu.identity, self._hostname, mig=mig, extra=self._extra_labels())
        points: list[Point] = []

        def emit(metric: str, value: float, kind: SeriesKind = GAUGE) -> None:
            points.append(Point(metric, labels, now, float(value), kind))

        self._memory(f"{gpu.identity.uuid}/gi{instance_id}", mig_handle, emit)
        return points


def _address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
