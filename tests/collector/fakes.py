"""Fakes of the GPU libraries the collector drives: NVML (nvidia-ml-py, ``pynvml``) and DCGM
(``pydcgm`` + ``DcgmReader``).

Both need a GPU, the NVIDIA driver and (for DCGM) a running nv-hostengine, none of which exist
where the tests run, so ``NvmlSource`` and ``DcgmSource`` are tested against these fakes, which
replay recorded values through the same call shapes as the real libraries:

- ``FakeNvml`` answers the ``nvmlDevice*`` calls ``pynvml`` exposes, with the real module's
  constants and exception classes (``pynvml`` imports without a driver). A function without a
  recorded answer raises ``NVMLError_NotSupported``, as NVML does for features a board lacks.
  A device with a ``power`` model (``tests/collector/fake_gpu_power.py``) has a power limit
  that can be set and read back, and an energy counter that integrates what it draws.
- ``FakeDcgm`` provides fake ``pydcgm``/``dcgm_fields``/``dcgm_structs``/``dcgm_agent`` modules
  and a ``DcgmReader`` look-alike. Shapes follow DCGM's own bindings (testing/python3 in
  NVIDIA/DCGM): ``DcgmReader(hostname=, fieldIds=, updateFrequency=, maxKeepAge=,
  fieldGroupName=, gpuIds=, entities=)``, ``Init()`` swallowing connection errors and leaving
  ``m_dcgmHandle`` None, ``Reconnect()`` raising them, ``m_dcgmGroup.samples.GetLatest_v2(
  m_fieldGroup).values`` as ``{entityGroupId: {entityId: {fieldId: DcgmFieldValueTimeSeries}}}``
  whose items have ``.value``, ``.ts`` (microseconds), ``.isBlank`` and ``.fieldType``;
  ``DcgmSystemDiscovery.GetGpuAttributes(id).identifiers``; ``dcgmGetGpuInstanceHierarchy``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from tests.collector.fake_gpu_power import FakeGpuPower

# --------------------------------------------------------------------------------------------
# NVML
# --------------------------------------------------------------------------------------------

_DEVICE_FUNCTIONS = frozenset(
    {
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceRegisterEvents",
    }
)


def nvml_error(code: int) -> pynvml.NVMLError:
    """``pynvml.NVMLError(code)`` builds the matching subclass (NVMLError_NotSupported, ...)."""
    return pynvml.NVMLError(code)


@dataclass
class FakeNvmlDevice:
    """One GPU or MIG device. ``answers`` maps an NVML function name to its recorded result:
    a value, a dict keyed by the call's extra arguments (``{(NVML_CLOCK_SM,): 1980}``), or an
    exception instance to raise. ``memory`` holds bytes for nvmlDeviceGetMemoryInfo, ``fields``
    nvmlDeviceGetFieldValues answers as ``{field_id: (value_type, value)}``."""

    answers: dict[str, Any]
    memory: Mapping[str, int] | None = None
    fields: dict[int, tuple[int, float]] = field(default_factory=dict)
    mig_devices: list[FakeNvmlDevice] = field(default_factory=list)
    lost: bool = False  # fell off the bus: every call raises NVMLError_GpuIsLost
    power: FakeGpuPower | None = None  # power management; None: NotSupported, as recorded
    calls: Counter[str] = field(default_factory=Counter)

    def __hash__(self) -> int:
        return id(self)


class FakeNvml:
    """Stands in for the ``pynvml`` module."""

    def __init__(self, devices: list[FakeNvmlDevice], driver_version: str = "570.133.20"):
        self.devices = devices
        self.driver_version = driver_version
        self.init_error: BaseException | None = None
        self.initialized = False
        self.event_sets: list[object] = []
        self.registered: list[FakeNvmlDevice] = []
        self.pending_xids: list[tuple[FakeNvmlDevice, int]] = []
        self.wait_timeouts: list[int] = []

    def __getattr__(self, name: str) -> Any:
        if name in _DEVICE_FUNCTIONS:
            return lambda handle, *args, **kwargs: self._answer(name, handle, *args, **kwargs)
        value = getattr(pynvml, name)  # constants and NVMLError classes are the real ones
        if name.startswith("nvml") and callable(value) and not isinstance(value, type):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    def _answer(self, name: str, handle: FakeNvmlDevice, *args: Any, **kwargs: Any) -> Any:
        handle.calls[name] += 1
        if handle.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if name not in handle.answers:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        answer = handle.answers[name]
        if isinstance(answer, dict):
            answer = answer.get(args, nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED))
        if isinstance(answer, BaseException):
            raise answer
        if name == "nvmlDeviceRegisterEvents":
            self.registered.append(handle)
        return answer

    # -- system ------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvmlDevice:
        device = self.devices[index]
        if device.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return device

    # -- power management (a device with a power model) --------------------------------------

    def _power(self, name: str, handle: FakeNvmlDevice) -> FakeGpuPower:
        handle.calls[name] += 1
        if handle.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if handle.power is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.power

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeNvmlDevice) -> list[int]:
        power = self._power("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [power.min_mw, power.max_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeNvmlDevice) -> int:
        return self._power("nvmlDeviceGetPowerManagementDefaultLimit", handle).default_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeNvmlDevice) -> int:
        return self._power("nvmlDeviceGetPowerManagementLimit", handle).limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeNvmlDevice) -> int:
        return self._power("nvmlDeviceGetEnforcedPowerLimit", handle).enforced_mw()

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeNvmlDevice, limit: int) -> None:
        self._power("nvmlDeviceSetPowerManagementLimit", handle).set_limit(int(limit))

    def nvmlDeviceGetPowerUsage(self, handle: FakeNvmlDevice) -> int:
        if handle.power is None:
            return int(self._answer("nvmlDeviceGetPowerUsage", handle))
        return int(self._power("nvmlDeviceGetPowerUsage", handle).draw_w() * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeNvmlDevice) -> int:
        if handle.power is None:
            return int(self._answer("nvmlDeviceGetTotalEnergyConsumption", handle))
        return self._power("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj()

    # -- calls with shapes of their own ------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: FakeNvmlDevice, version: int | None = None) -> Any:
        handle.calls["nvmlDeviceGetMemoryInfo"] += 1
        if handle.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if handle.memory is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        m = handle.memory
        if version is None:  # nvmlMemory_t: "used" includes the driver's reservation
            return SimpleNamespace(total=m["total"], free=m["free"], used=m["used"] + m["reserved"])
        return SimpleNamespace(
            version=version,
            total=m["total"],
            reserved=m["reserved"],
            free=m["free"],
            used=m["used"],
        )

    def nvmlDeviceGetFieldValues(self, handle: FakeNvmlDevice, field_ids: list[Any]) -> list[Any]:
        handle.calls["nvmlDeviceGetFieldValues"] += 1
        if handle.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        values = []
        for requested in field_ids:
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            recorded = handle.fields.get(field_id)
            if recorded is None:
                ret, value_type, number = pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0.0
            else:
                ret, (value_type, number) = pynvml.NVML_SUCCESS, recorded
            union = SimpleNamespace(
                dVal=float(number),
                uiVal=int(number),
                ulVal=int(number),
                ullVal=int(number),
                sllVal=int(number),
                siVal=int(number),
                usVal=int(number),
            )
            values.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    timestamp=0,
                    latencyUsec=0,
                    valueType=value_type,
                    nvmlReturn=ret,
                    value=union,
                )
            )
        return values

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeNvmlDevice, index: int) -> Any:
        handle.calls["nvmlDeviceGetMigDeviceHandleByIndex"] += 1
        if handle.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if index >= len(handle.mig_devices):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return handle.mig_devices[index]

    # -- events ------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        event_set = object()
        self.event_sets.append(event_set)
        return event_set

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.event_sets.remove(event_set)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        self.wait_timeouts.append(timeout_ms)
        if not self.pending_xids:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        device, xid = self.pending_xids.pop(0)
        return SimpleNamespace(
            device=device,
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )


def _mib(value: int) -> int:
    return value * (1 << 20)


def h100_answers(
    *,
    uuid: str,
    bus_id: str,
    minor: int,
    util: tuple[int, int] = (97, 61),
    milliwatts: int = 612_345,
) -> dict[str, Any]:
    """NVML answers of an H100 80GB HBM3 (SXM5) under a training load, as recorded with
    nvidia-smi/pynvml on such boards: 700 W TDP, SM clock 1980 MHz, HBM3 clock 2619 MHz. Page
    retirement is NotSupported there (row remapping replaced it from Ampere on)."""
    not_supported = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return {
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=bus_id.encode()),  # bytes, as older pynvml
        "nvmlDeviceGetMinorNumber": minor,
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=util[0], memory=util[1]),
        "nvmlDeviceGetEncoderUtilization": [0, 167000],
        "nvmlDeviceGetDecoderUtilization": [0, 167000],
        "nvmlDeviceGetPowerUsage": milliwatts,
        "nvmlDeviceGetTotalEnergyConsumption": 9_312_884_417,  # mJ: past 2**31 after ~1 h
        "nvmlDeviceGetTemperature": {(pynvml.NVML_TEMPERATURE_GPU,): 54},
        "nvmlDeviceGetClockInfo": {(pynvml.NVML_CLOCK_SM,): 1980, (pynvml.NVML_CLOCK_MEM,): 2619},
        "nvmlDeviceGetPcieThroughput": {
            (pynvml.NVML_PCIE_UTIL_TX_BYTES,): 1156,
            (pynvml.NVML_PCIE_UTIL_RX_BYTES,): 24822,
        },
        "nvmlDeviceGetPcieReplayCounter": 0,
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.nvmlClocksEventReasonSwPowerCap,
        "nvmlDeviceGetTotalEccErrors": {
            (0, pynvml.NVML_VOLATILE_ECC): 0,
            (1, pynvml.NVML_VOLATILE_ECC): 0,
            (0, pynvml.NVML_AGGREGATE_ECC): 2,
            (1, pynvml.NVML_AGGREGATE_ECC): 0,
        },
        "nvmlDeviceGetRetiredPages": not_supported,
        "nvmlDeviceGetRetiredPagesPendingStatus": not_supported,
        "nvmlDeviceGetRemappedRows": (1, 0, 0, 0),
        "nvmlDeviceGetMigMode": [0, 0],
        "nvmlDeviceRegisterEvents": None,
    }


H100_MEMORY = {
    "total": _mib(81559),
    "reserved": _mib(597),
    "used": _mib(76822),
    "free": _mib(81559 - 597 - 76822),
}
H100_FIELDS = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 62),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: (
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        4_812_339_520,
    ),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: (
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        4_809_127_104,
    ),
}


def recorded_h100_node() -> FakeNvml:
    """Three H100s: GPU 0 training, GPU 1 that will fall off the bus in the test, GPU 2 in MIG
    mode with a 4g.40gb (GPU instance 1) and a 3g.40gb (GPU instance 2)."""
    gpu0 = FakeNvmlDevice(
        h100_answers(
            uuid="GPU-5c3d8a27-6b1e-4f0a-9d42-7e1b0c9a3f61", bus_id="00000000:18:00.0", minor=0
        ),
        memory=H100_MEMORY,
        fields=dict(H100_FIELDS),
    )
    gpu1 = FakeNvmlDevice(
        h100_answers(
            uuid="GPU-a18f2c44-03d9-4b7e-8c15-2f6d9e0b7a38", bus_id="00000000:2A:00.0", minor=1
        ),
        memory=H100_MEMORY,
        fields=dict(H100_FIELDS),
    )
    mig_answers = h100_answers(
        uuid="GPU-6f1a3d98-b4e2-47c0-95a6-c83b0e2d7f49", bus_id="00000000:DB:00.0", minor=7
    )
    # In MIG mode the parent's utilization counters are not available.
    mig_answers["nvmlDeviceGetUtilizationRates"] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    mig_answers["nvmlDeviceGetMigMode"] = [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    mig_answers["nvmlDeviceGetMaxMigDeviceCount"] = 7
    instances = [
        FakeNvmlDevice(
            {
                "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3 MIG 4g.40gb",
                "nvmlDeviceGetGpuInstanceId": 1,
            },
            memory={
                "total": _mib(40192),
                "reserved": _mib(38),
                "used": _mib(36021),
                "free": _mib(4133),
            },
        ),
        FakeNvmlDevice(
            {
                "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                "nvmlDeviceGetGpuInstanceId": 2,
            },
            memory={"total": _mib(40192), "reserved": _mib(38), "used": 0, "free": _mib(40154)},
        ),
    ]
    gpu2 = FakeNvmlDevice(
        mig_answers, memory=H100_MEMORY, fields=dict(H100_FIELDS), mig_devices=instances
    )
    return FakeNvml([gpu0, gpu1, gpu2])


# --------------------------------------------------------------------------------------------
# DCGM
# --------------------------------------------------------------------------------------------

DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
DCGM_INT64_NOT_SUPPORTED = DCGM_INT64_BLANK + 2
DCGM_INT32_NOT_SUPPORTED = 0x7FFFFFF0 + 2
DCGM_FP64_NOT_SUPPORTED = DCGM_FP64_BLANK + 2.0
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_CONNECTION_NOT_VALID = -21

FE_NONE, FE_GPU, FE_GPU_I = 0, 1, 4

# dcgm_fields ids (DCGM 3.x/4.x, testing/python3/dcgm_fields.py)
DCGM_FIELD_IDS = {
    "DCGM_FI_DRIVER_VERSION": 1,
    "DCGM_FI_DEV_NAME": 50,
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_MEM_CLOCK": 101,
    "DCGM_FI_DEV_MEMORY_TEMP": 140,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 204,
    "DCGM_FI_DEV_ENC_UTIL": 206,
    "DCGM_FI_DEV_DEC_UTIL": 207,
    "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_FB_FREE": 251,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_FB_RESERVED": 253,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 394,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 449,
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 526,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
    "DCGM_FI_PROF_DRAM_ACTIVE": 1005,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
}
# DCGM 4.6 canonical names for renamed fields (old names stay as deprecated aliases).
DCGM_46_RENAMES = {
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
}


class FakeDCGMError(Exception):
    """dcgm_structs.DCGMError: ``.value`` is the DCGM_ST_* status."""

    def __init__(self, value: int):
        super().__init__(f"DCGM error {value}")
        self.value = value


class FakeDcgmFieldValue:
    """dcgm_field_helpers.DcgmFieldValue: blanks flagged as the real one flags them (int64 and
    double sentinels only; an int32 sentinel inside an int64 value is not flagged)."""

    def __init__(self, field_id: int, value: Any, ts: int, field_type: str = "i"):
        self.fieldId = field_id
        self.fieldType = field_type
        self.ts = ts
        self.value = value
        if field_type == "d":
            self.isBlank = value >= DCGM_FP64_BLANK
        elif field_type == "s":
            self.isBlank = value.startswith("<<<") and ">>>" in value
        else:
            self.isBlank = value >= DCGM_INT64_BLANK


class FakeDcgmFieldValueTimeSeries:
    """dcgm_field_helpers.DcgmFieldValueTimeSeries: ``.values`` in timestamp order."""

    def __init__(self, values: list[FakeDcgmFieldValue]):
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, key: int) -> FakeDcgmFieldValue:
        return self.values[key]


@dataclass
class FakeDcgmGpu:
    gpu_id: int
    uuid: str
    pci_bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"


@dataclass
class FakeGpuInstance:
    entity_id: int  # DCGM's GPU-instance entity id
    parent_gpu: int
    nvml_instance_id: int
    profile: str


class _FakeGroupSamples:
    def __init__(self, dcgm: FakeDcgm, entities: list[tuple[int, int]]):
        self._dcgm = dcgm
        self._entities = entities
        self.watched: list[Any] = []

    def WatchFields(
        self, fieldGroup: Any, updateFreq: int, maxKeepAge: float, maxKeepSamples: int
    ) -> None:
        # Profiling fields (ids 1001+) need DCGM's profiling module, absent on some GPUs.
        if not self._dcgm.profiling_supported and any(f > 1000 for f in fieldGroup.fieldIds):
            raise FakeDCGMError(DCGM_ST_NOT_SUPPORTED)
        self.watched.append((fieldGroup, updateFreq, maxKeepAge, maxKeepSamples))

    def GetLatest_v2(self, fieldGroup: Any) -> Any:
        self._dcgm.check_up()
        self._dcgm.latest_calls += 1
        wanted = set(fieldGroup.fieldIds)
        values: dict[int, dict[int, dict[int, FakeDcgmFieldValueTimeSeries]]] = {}
        for group, entity in [*self._entities, (FE_NONE, 0)]:
            recorded = self._dcgm.values.get((group, entity), {})
            series = {
                fid: FakeDcgmFieldValueTimeSeries([v])
                for fid, v in recorded.items()
                if fid in wanted
            }
            if series:
                values.setdefault(group, {})[entity] = series
        return SimpleNamespace(values=values)


class _FakeGroup:
    def __init__(self, dcgm: FakeDcgm, entities: list[tuple[int, int]]):
        self.entities = entities
        self.samples = _FakeGroupSamples(dcgm, entities)

    def GetGpuIds(self) -> list[int]:
        return [entity for group, entity in self.entities if group == FE_GPU]

    def AddEntity(self, entityGroupId: int, entityId: int) -> None:
        self.entities.append((entityGroupId, entityId))


class FakeDcgmReader:
    """DcgmReader.DcgmReader's public surface, over a FakeDcgm host engine."""

    def __init__(
        self,
        dcgm: FakeDcgm,
        hostname: str = "localhost",
        fieldIds: list[int] | None = None,
        updateFrequency: int = 10_000_000,
        maxKeepAge: float = 3600.0,
        ignoreList: list[int] | None = None,
        fieldGroupName: str = "dcgm_fieldgroupData",
        gpuIds: list[int] | None = None,
        entities: list[Any] | None = None,
        fieldIntervalMap: dict[int, list[int]] | None = None,
    ):
        self._dcgm = dcgm
        self.m_dcgmHostName = hostname
        self.m_publishFields = fieldIntervalMap or {updateFrequency: list(fieldIds or [])}
        self.m_requestedGpuIds = gpuIds
        self.m_requestedEntities = entities
        self.m_maxKeepAge = maxKeepAge
        self.m_fieldGroupName = fieldGroupName
        self.m_dcgmHandle: Any = None
        self.m_dcgmSystem: Any = None
        self.m_dcgmGroup: Any = None
        self.m_fieldGroup: Any = None
        self.m_gpuIdToBusId: dict[int, str] = {}
        self.m_gpuIdToUUId: dict[int, str] = {}
        self.m_closeHandle = False
        self.m_lock = threading.Lock()

    def Init(self, libpath: str | None = None) -> None:
        with self.m_lock:
            try:
                self.Reconnect()
            except FakeDCGMError as exc:
                if exc.value != DCGM_ST_CONNECTION_NOT_VALID:
                    raise
                self.SetDisconnected()  # the real Init logs "Is it down?" and carries on

    def Reconnect(self) -> None:
        if self.m_dcgmHandle is not None:
            return
        self.m_dcgmHandle = self._dcgm.pydcgm.DcgmHandle(None, self.m_dcgmHostName, 1)
        self.m_closeHandle = True
        self.InitializeFromHandle()

    def InitializeFromHandle(self) -> None:
        self.m_dcgmSystem = self.m_dcgmHandle.GetSystem()
        if not self.m_requestedGpuIds and not self.m_requestedEntities:
            entities = [(FE_GPU, gpu) for gpu in self._dcgm.gpus]
        else:
            entities = [(FE_GPU, gpu) for gpu in self.m_requestedGpuIds or []]
            entities += [(e.entityGroupId, e.entityId) for e in self.m_requestedEntities or []]
        self.m_dcgmGroup = _FakeGroup(self._dcgm, entities)
        for gpu in self.m_dcgmGroup.GetGpuIds():
            self.m_gpuIdToBusId[gpu] = self._dcgm.gpus[gpu].pci_bus_id
            self.m_gpuIdToUUId[gpu] = self._dcgm.gpus[gpu].uuid
        all_ids = [fid for ids in self.m_publishFields.values() for fid in ids]
        self.m_fieldGroup = SimpleNamespace(name=self.m_fieldGroupName, fieldIds=all_ids)
        for interval, ids in self.m_publishFields.items():
            self.m_dcgmGroup.samples.WatchFields(
                SimpleNamespace(fieldIds=ids), interval, self.m_maxKeepAge, 0
            )

    def SetDisconnected(self) -> None:
        self.m_dcgmGroup = None
        self.m_dcgmSystem = None
        self.m_dcgmHandle = None

    def Shutdown(self) -> None:
        with self.m_lock:
            if self.m_closeHandle:
                self.SetDisconnected()
        self._dcgm.shutdowns += 1


class FakeDcgm:
    """A DCGM host engine with recorded values, and fake binding modules bound to it.

    ``values[(entity_group, entity_id)][field_id]`` is the latest FakeDcgmFieldValue; global
    fields (the driver version) live under ``(FE_NONE, 0)``. ``up = False`` makes connects and
    reads fail with DCGM_ST_CONNECTION_NOT_VALID, as a stopped nv-hostengine does.
    """

    def __init__(
        self,
        gpus: list[FakeDcgmGpu],
        instances: list[FakeGpuInstance] | None = None,
        *,
        dcgm_46_names: bool = False,
        without_deprecated_aliases: bool = False,
    ):
        self.gpus = {gpu.gpu_id: gpu for gpu in gpus}
        self.instances = instances or []
        self.values: dict[tuple[int, int], dict[int, FakeDcgmFieldValue]] = {}
        self.up = True
        self.profiling_supported = True
        self.latest_calls = 0
        self.shutdowns = 0
        self.readers: list[FakeDcgmReader] = []
        self.dcgm_fields = self._fields_module(dcgm_46_names, without_deprecated_aliases)
        self.dcgm_structs = SimpleNamespace(
            DCGMError=FakeDCGMError,
            DCGM_ST_CONNECTION_NOT_VALID=DCGM_ST_CONNECTION_NOT_VALID,
            DCGM_OPERATION_MODE_AUTO=1,
            c_dcgmGroupEntityPair_t=lambda group, entity: SimpleNamespace(
                entityGroupId=group, entityId=entity
            ),
        )
        self.pydcgm = SimpleNamespace(DcgmHandle=self._handle)
        self.dcgm_agent = SimpleNamespace(dcgmGetGpuInstanceHierarchy=self._hierarchy)
        for instance in self.instances:  # a GPU instance's DCGM_FI_DEV_NAME is its profile
            self.record(FE_GPU_I, instance.entity_id, "DCGM_FI_DEV_NAME", instance.profile, "s")

    @staticmethod
    def _fields_module(dcgm_46_names: bool, without_aliases: bool) -> SimpleNamespace:
        """dcgm_fields: DCGM 4.6 adds canonical names and keeps the old ones as deprecated
        aliases; ``without_aliases`` drops those, as bindings built with them disabled do."""
        names = dict(DCGM_FIELD_IDS)
        if dcgm_46_names:
            names.update({new: names[old] for old, new in DCGM_46_RENAMES.items()})
            if without_aliases:
                for old in DCGM_46_RENAMES:
                    del names[old]
        return SimpleNamespace(
            DCGM_FE_NONE=FE_NONE, DCGM_FE_GPU=FE_GPU, DCGM_FE_GPU_I=FE_GPU_I, **names
        )

    def check_up(self) -> None:
        if not self.up:
            raise FakeDCGMError(DCGM_ST_CONNECTION_NOT_VALID)

    def record(
        self, group: int, entity: int, name: str, value: Any, field_type: str = "i", ts: int = 1
    ) -> None:
        field_id = DCGM_FIELD_IDS[name]
        self.values.setdefault((group, entity), {})[field_id] = FakeDcgmFieldValue(
            field_id, value, ts, field_type
        )

    def reader_factory(self, **kwargs: Any) -> FakeDcgmReader:
        reader = FakeDcgmReader(self, **kwargs)
        self.readers.append(reader)
        return reader

    def modules(self) -> Any:
        from collector.sources.dcgm import DcgmModules

        return DcgmModules(
            pydcgm=self.pydcgm,
            dcgm_fields=self.dcgm_fields,
            dcgm_structs=self.dcgm_structs,
            dcgm_agent=self.dcgm_agent,
            DcgmReader=self.reader_factory,
        )

    def _handle(self, handle: Any = None, ipAddress: str | None = None, opMode: int = 1) -> Any:
        self.check_up()
        dcgm = self

        def attributes(gpu_id: int) -> Any:
            gpu = dcgm.gpus[gpu_id]
            return SimpleNamespace(
                identifiers=SimpleNamespace(
                    uuid=gpu.uuid, pciBusId=gpu.pci_bus_id, deviceName=gpu.name
                )
            )

        discovery = SimpleNamespace(
            GetAllSupportedGpuIds=lambda: list(dcgm.gpus), GetGpuAttributes=attributes
        )
        system = SimpleNamespace(discovery=discovery)
        return SimpleNamespace(handle=object(), GetSystem=lambda: system, Shutdown=lambda: None)

    def _hierarchy(self, handle: Any) -> Any:
        self.check_up()
        entries = [
            SimpleNamespace(
                entity=SimpleNamespace(entityGroupId=FE_GPU_I, entityId=i.entity_id),
                parent=SimpleNamespace(entityGroupId=FE_GPU, entityId=i.parent_gpu),
                info=SimpleNamespace(nvmlInstanceId=i.nvml_instance_id),
            )
            for i in self.instances
        ]
        return SimpleNamespace(count=len(entries), entityList=entries)
