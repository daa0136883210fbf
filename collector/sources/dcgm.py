"""GPU metrics from a DCGM host engine through DCGM's own Python bindings (pydcgm, DcgmReader).

The bindings ship with the DCGM package, not on PyPI; they are found on the standard install
paths or a configured one. Series carry dcgm-exporter's metric names and labels (see
``gpu_labels``), so dashboards and alert rules written for dcgm-exporter apply unchanged.

Lifecycle: ``start`` loads the bindings and the counter list and fails fast when either is
missing or wrong (configuration errors). Connecting to nv-hostengine happens in ``collect``: when
the engine is down ``collect`` raises ``DcgmConnectionError`` for the runner to report, and the
next ``collect`` connects afresh (re-discovering GPUs and MIG instances).

What it reads, in DcgmReader's terms: a ``DcgmReader`` watches the field set on a group holding
the non-MIG GPUs and the MIG GPU instances (dcgm-exporter's choice: a GPU in MIG mode is reported
per instance only), and each collect takes ``m_dcgmGroup.samples.GetLatest_v2(m_fieldGroup)`` --
the entity-aware form of what ``DcgmReader.GetLatestGpuValuesAsFieldIdDict`` reads, which covers
GPUs only and drops the value objects' blank flag.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from collector.points import Point
from collector.sources import dcgm_fields as fields_mod
from collector.sources.dcgm_fields import CounterField
from collector.sources.gpu_labels import (
    XID_METRIC,
    GpuIdentity,
    MigIdentity,
    as_text,
    device_name,
    gpu_labels,
    xid_attributes,
)

log = logging.getLogger(__name__)

STANDARD_BINDINGS_PATHS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
    "/usr/share/datacenter-gpu-manager/bindings/python3",
    "/usr/local/dcgm/bindings",
)
_BINDING_MODULES = ("pydcgm", "dcgm_fields", "dcgm_structs", "dcgm_agent", "DcgmReader")

# dcgm_fields' entity groups; the bindings' own constants win when present.
_FE_NONE, _FE_GPU, _FE_GPU_I = 0, 1, 4
_PROFILING_PREFIX = "DCGM_FI_PROF_"


class DcgmUnavailableError(RuntimeError):
    """The DCGM Python bindings cannot be found or imported (a configuration error)."""


class DcgmConnectionError(ConnectionError):
    """nv-hostengine cannot be reached or dropped the connection; the next collect retries."""


@dataclass(slots=True)
class DcgmModules:
    """The binding modules the source uses; a fake of the same shape stands in for tests."""

    pydcgm: Any
    dcgm_fields: Any
    dcgm_structs: Any
    dcgm_agent: Any
    DcgmReader: Any  # the DcgmReader.DcgmReader class


def load_dcgm_modules(bindings_path: str | os.PathLike[str] | None = None) -> DcgmModules:
    """Import the bindings from ``bindings_path``, else from sys.path, else from the standard
    DCGM install paths. The directory goes on sys.path because the modules import one another
    by bare name (``import dcgm_structs``)."""
    if bindings_path is not None:
        candidates: list[str | None] = [os.fspath(bindings_path)]
    else:
        candidates = [None, *STANDARD_BINDINGS_PATHS]
    problems: list[str] = []
    for directory in candidates:
        if directory is not None:
            if not (Path(directory) / "pydcgm.py").is_file():
                problems.append(f"{directory}: no pydcgm.py")
                continue
            if directory not in sys.path:
                sys.path.insert(0, directory)
        try:
            loaded = {name: importlib.import_module(name) for name in _BINDING_MODULES}
        except (ImportError, OSError) as exc:
            problems.append(f"{directory or 'sys.path'}: {exc}")
            continue
        return DcgmModules(
            pydcgm=loaded["pydcgm"],
            dcgm_fields=loaded["dcgm_fields"],
            dcgm_structs=loaded["dcgm_structs"],
            dcgm_agent=loaded["dcgm_agent"],
            DcgmReader=loaded["DcgmReader"].DcgmReader,
        )
    raise DcgmUnavailableError(
        "DCGM Python bindings not found (they ship with the datacenter-gpu-manager package, "
        "not on PyPI); set the bindings path. Tried: " + "; ".join(problems)
    )


@dataclass(slots=True)
class _Session:
    reader: Any
    gpus: dict[int, GpuIdentity]
    instances: dict[int, tuple[int, int]]  # GPU-instance entity id -> (GPU id, NVML GI id)


@dataclass(frozen=True, slots=True)
class _Plan:
    """The resolved field set: what to watch and how each id turns into a series or label."""

    metrics: list[tuple[CounterField, int]]
    labels: list[tuple[CounterField, int]]
    name_field: int | None

    @property
    def watch_ids(self) -> list[int]:
        ids = [number for _, number in (*self.metrics, *self.labels)]
        if self.name_field is not None:
            ids.append(self.name_field)
        return list(dict.fromkeys(ids))

    @property
    def has_profiling(self) -> bool:
        return any(c.name.startswith(_PROFILING_PREFIX) for c, _ in self.metrics)

    def without_profiling(self) -> _Plan:
        metrics = [(c, n) for c, n in self.metrics if not c.name.startswith(_PROFILING_PREFIX)]
        return _Plan(metrics, self.labels, self.name_field)


class DcgmSource:
    name = "dcgm"

    def __init__(
        self,
        bindings_path: str | os.PathLike[str] | None = None,
        fields_csv: str | os.PathLike[str] | None = None,
        hostname: str | None = None,
        reader_factory: Callable[..., Any] | None = None,
        *,
        host_engine: str = "localhost",
        update_interval_s: float = 10.0,
        modules: DcgmModules | None = None,
    ) -> None:
        if update_interval_s <= 0:
            raise ValueError("update_interval_s must be positive")
        self._bindings_path = bindings_path
        self._fields_csv = fields_csv
        self._hostname = hostname or socket.gethostname()
        self._reader_factory = reader_factory
        self._host_engine = host_engine
        self._update_interval_s = update_interval_s
        self._modules = modules
        self._plan: _Plan | None = None
        self._session: _Session | None = None
        self.unknown_fields: list[str] = []
        self.profiling_disabled = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load bindings and counters; raises DcgmUnavailableError or CounterCsvError."""
        if self._modules is None:
            self._modules = load_dcgm_modules(self._bindings_path)
        counters = fields_mod.load_counters(self._fields_csv)
        self._plan = self._make_plan(counters, self._modules.dcgm_fields)
        self.profiling_disabled = False

    def collect(self, now: datetime) -> list[Point]:
        if self._plan is None:
            self.start()
        if self._session is None:
            self._session = self._connect()
        modules, session = self._require_modules(), self._session
        try:
            values = self._latest(session.reader)
        except modules.dcgm_structs.DCGMError as exc:
            self._disconnect()
            raise DcgmConnectionError(f"reading from nv-hostengine failed: {exc}") from exc
        if session.reader.m_dcgmHandle is None:
            self._disconnect()
            raise DcgmConnectionError(f"nv-hostengine at {self._host_engine} went away")
        return list(self._points(values, session, now))

    def shutdown(self) -> None:
        self._disconnect()

    # -- set-up ------------------------------------------------------------------------------

    def _make_plan(self, counters: list[CounterField], dcgm_fields: Any) -> _Plan:
        ids, unknown = fields_mod.resolve_field_ids(counters, dcgm_fields)
        if unknown:
            log.warning("DCGM bindings do not know %s; not collected", ", ".join(unknown))
        self.unknown_fields = unknown
        metrics = [(c, ids[c.name]) for c in counters if c.name in ids and not c.is_label]
        labels = [(c, ids[c.name]) for c in counters if c.name in ids and c.is_label]
        # The GPU instance's DCGM_FI_DEV_NAME is its MIG profile ("1g.10gb"), dcgm-exporter's
        # GPU_I_PROFILE; watched alongside, never emitted.
        name_field = fields_mod.field_id(dcgm_fields, "DCGM_FI_DEV_NAME")
        return _Plan(metrics, labels, name_field)

    def _require_modules(self) -> DcgmModules:
        if self._modules is None:
            raise DcgmUnavailableError("DcgmSource.start() has not loaded the bindings")
        return self._modules

    def _connect(self) -> _Session:
        modules = self._require_modules()
        assert self._plan is not None
        structs = modules.dcgm_structs
        try:
            handle = modules.pydcgm.DcgmHandle(
                None, self._host_engine, structs.DCGM_OPERATION_MODE_AUTO
            )
        except structs.DCGMError as exc:
            raise DcgmConnectionError(
                f"cannot connect to nv-hostengine at {self._host_engine}: {exc}"
            ) from exc
        try:
            gpus, instances = self._discover(handle, modules)
        except structs.DCGMError as exc:
            raise DcgmConnectionError(f"DCGM discovery failed: {exc}") from exc
        finally:
            # DCGM allows one client connection per process; the reader opens its own.
            handle.Shutdown()
        reader = self._start_reader(gpus, instances, modules)
        if reader.m_dcgmHandle is None:  # DcgmReader.Init logs and swallows connect errors
            raise DcgmConnectionError(f"cannot connect to nv-hostengine at {self._host_engine}")
        return _Session(reader, gpus, instances)

    def _discover(
        self, handle: Any, modules: DcgmModules
    ) -> tuple[dict[int, GpuIdentity], dict[int, tuple[int, int]]]:
        discovery = handle.GetSystem().discovery
        gpus: dict[int, GpuIdentity] = {}
        for gpu_id in discovery.GetAllSupportedGpuIds():
            try:
                identifiers = discovery.GetGpuAttributes(gpu_id).identifiers
            except modules.dcgm_structs.DCGMError as exc:
                log.warning("DCGM GPU %s: attributes unavailable (%s); skipped", gpu_id, exc)
                continue
            gpus[int(gpu_id)] = GpuIdentity(
                gpu=str(gpu_id),
                uuid=as_text(identifiers.uuid),
                pci_bus_id=as_text(identifiers.pciBusId),
                device=device_name(gpu_id),  # dcgm-exporter: nvidia<DCGM GPU id>
                model_name=as_text(identifiers.deviceName),
            )
        return gpus, self._gpu_instances(handle, modules)

    def _gpu_instances(self, handle: Any, modules: DcgmModules) -> dict[int, tuple[int, int]]:
        fe_gpu = getattr(modules.dcgm_fields, "DCGM_FE_GPU", _FE_GPU)
        fe_gpu_i = getattr(modules.dcgm_fields, "DCGM_FE_GPU_I", _FE_GPU_I)
        try:
            hierarchy = modules.dcgm_agent.dcgmGetGpuInstanceHierarchy(handle.handle)
        except modules.dcgm_structs.DCGMError as exc:
            log.info("DCGM MIG hierarchy unavailable (%s); reporting whole GPUs", exc)
            return {}
        instances: dict[int, tuple[int, int]] = {}
        for position in range(int(hierarchy.count)):
            entry = hierarchy.entityList[position]
            if entry.entity.entityGroupId == fe_gpu_i and entry.parent.entityGroupId == fe_gpu:
                instances[int(entry.entity.entityId)] = (
                    int(entry.parent.entityId),
                    int(entry.info.nvmlInstanceId),
                )
        return instances

    def _start_reader(
        self,
        gpus: Mapping[int, GpuIdentity],
        instances: Mapping[int, tuple[int, int]],
        modules: DcgmModules,
    ) -> Any:
        reader = self._make_reader(gpus, instances, modules)
        try:
            reader.Init()
            return reader
        except modules.dcgm_structs.DCGMError as exc:
            _shutdown_quietly(reader)
            assert self._plan is not None
            if not self._plan.has_profiling:
                raise
            # Profiling (DCP) fields need DCGM's profiling module and a GPU that has it, and
            # fail while another profiler (Nsight) holds the counters; dcgm-exporter also goes
            # on without them. They come back when the source is restarted.
            log.warning("DCGM cannot watch DCGM_FI_PROF_* fields (%s); collecting the rest", exc)
            self._plan = self._plan.without_profiling()
            self.profiling_disabled = True
        reader = self._make_reader(gpus, instances, modules)
        reader.Init()
        return reader

    def _make_reader(
        self,
        gpus: Mapping[int, GpuIdentity],
        instances: Mapping[int, tuple[int, int]],
        modules: DcgmModules,
    ) -> Any:
        assert self._plan is not None
        interval_us = int(self._update_interval_s * 1_000_000)
        kwargs: dict[str, Any] = {
            "hostname": self._host_engine,
            "fieldIds": self._plan.watch_ids,
            "updateFrequency": interval_us,
            "maxKeepAge": max(60.0, 4 * self._update_interval_s),
            "fieldGroupName": f"tuneloop_{os.getpid()}",
        }
        if instances:
            fe_gpu_i = getattr(modules.dcgm_fields, "DCGM_FE_GPU_I", _FE_GPU_I)
            mig_parents = {parent for parent, _ in instances.values()}
            kwargs["gpuIds"] = [gpu for gpu in gpus if gpu not in mig_parents]
            kwargs["entities"] = [
                modules.dcgm_structs.c_dcgmGroupEntityPair_t(fe_gpu_i, entity)
                for entity in instances
            ]
        factory = self._reader_factory or modules.DcgmReader
        return factory(**kwargs)

    def _disconnect(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            _shutdown_quietly(session.reader)

    # -- reading -----------------------------------------------------------------------------

    @staticmethod
    def _latest(reader: Any) -> Mapping[Any, Any]:
        # Same locking and reconnect as DcgmReader.GetLatestGpuValuesAsDict, but entity-aware,
        # and letting connection errors out instead of logging them away.
        with reader.m_lock:
            reader.Reconnect()
            values = reader.m_dcgmGroup.samples.GetLatest_v2(reader.m_fieldGroup).values
        return values if isinstance(values, Mapping) else {}

    def _points(
        self, values: Mapping[Any, Any], session: _Session, now: datetime
    ) -> Iterator[Point]:
        assert self._plan is not None
        fields_module = self._require_modules().dcgm_fields
        fe_none = getattr(fields_module, "DCGM_FE_NONE", _FE_NONE)
        fe_gpu = getattr(fields_module, "DCGM_FE_GPU", _FE_GPU)
        fe_gpu_i = getattr(fields_module, "DCGM_FE_GPU_I", _FE_GPU_I)
        # Global fields (the driver version) come back once, on the "no entity" group.
        global_labels: dict[str, str] = {}
        for entity_values in _as_mapping(values.get(fe_none)).values():
            global_labels.update(self._label_values(_as_mapping(entity_values)))
        for group in (fe_gpu, fe_gpu_i):
            for entity_id, entity_values in _as_mapping(values.get(group)).items():
                target = self._target(group == fe_gpu_i, entity_id, session, entity_values)
                if target is None:
                    continue
                identity, mig = target
                fvs = _as_mapping(entity_values)
                extra = {**global_labels, **self._label_values(fvs)}
                yield from self._entity_points(identity, mig, extra, fvs, now)

    def _target(
        self, is_instance: bool, entity_id: Any, session: _Session, entity_values: Any
    ) -> tuple[GpuIdentity, MigIdentity | None] | None:
        if not is_instance:
            identity = session.gpus.get(entity_id)
            return None if identity is None else (identity, None)
        parent = session.instances.get(entity_id)
        identity = session.gpus.get(parent[0]) if parent else None
        if parent is None or identity is None:
            return None
        profile = ""
        if self._plan is not None and self._plan.name_field is not None:
            name = _latest_value(_as_mapping(entity_values).get(self._plan.name_field))
            profile = as_text(name) if name is not None else ""
        return identity, MigIdentity(profile=profile, instance_id=str(parent[1]))

    def _label_values(self, fvs: Mapping[Any, Any]) -> dict[str, str]:
        assert self._plan is not None
        labels: dict[str, str] = {}
        for counter, number in self._plan.labels:
            value = _latest_value(fvs.get(number))
            if value is not None:
                labels[counter.name] = _label_text(value)
        return labels

    def _entity_points(
        self,
        identity: GpuIdentity,
        mig: MigIdentity | None,
        extra: Mapping[str, str],
        fvs: Mapping[Any, Any],
        now: datetime,
    ) -> Iterator[Point]:
        assert self._plan is not None
        for counter, number in self._plan.metrics:
            value = _latest_value(fvs.get(number))
            if value is None or isinstance(value, str | bytes):
                continue
            attributes = xid_attributes(int(value)) if counter.name == XID_METRIC else None
            labels = gpu_labels(
                identity, self._hostname, mig=mig, extra=extra, attributes=attributes
            )
            # Stamped with the poll time, as dcgm-exporter's output is stamped by the scrape;
            # DCGM's own sample time would repeat for slow-changing fields.
            yield Point(counter.name, labels, now, float(value), counter.kind)


def _shutdown_quietly(reader: Any) -> None:
    try:
        reader.Shutdown()
    except Exception:  # shutting down a broken connection must not mask the cause
        log.debug("DcgmReader.Shutdown failed", exc_info=True)


def _as_mapping(value: Any) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


def _latest_value(series: Any) -> int | float | str | bytes | None:
    """The newest non-blank value of a DcgmFieldValueTimeSeries (values in time order, each
    with ``.value`` and ``.isBlank``); None for missing, blank or unusable values."""
    if series is None:
        return None
    try:
        newest = series[-1]
    except (IndexError, KeyError, TypeError):
        return None
    if getattr(newest, "isBlank", False):
        return None
    value = getattr(newest, "value", None)
    if not isinstance(value, int | float | str | bytes) or fields_mod.is_blank(value):
        return None
    return value


def _label_text(value: int | float | str | bytes) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return as_text(value)
