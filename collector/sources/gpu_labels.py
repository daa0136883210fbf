"""GPU label sets in dcgm-exporter's shape, shared by the DCGM and NVML sources.

dcgm-exporter renders GPU metrics with the labels, in this order: ``gpu``, ``UUID``,
``pci_bus_id``, ``device`` (``nvidia<gpu>``), ``modelName``, then ``GPU_I_PROFILE`` and
``GPU_I_ID`` for MIG instances only, ``Hostname``, then label-type counter rows
(``DCGM_FI_DRIVER_VERSION``), then per-metric attributes (``err_code``/``err_msg`` on
``DCGM_FI_DEV_XID_ERRORS``). Label order carries no meaning in Prometheus, but keeping it makes
our series print exactly like dcgm-exporter's, which eases side-by-side checks.

These names are tuneloop's one label vocabulary: every source, rule, inhibit rule, notifier and
cost figure keys on them. The host is ``Hostname``, as dcgm-exporter spelled it until May 2026
and as most deployed exporters still emit it; the newer exporters' ``hostname`` is renamed to
it on the scrape path (:func:`normalize_host`). Empty label values are never emitted: Prometheus
treats an empty label as an absent one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GPU = "gpu"
UUID = "UUID"
PCI_BUS_ID = "pci_bus_id"
DEVICE = "device"
MODEL_NAME = "modelName"
MIG_PROFILE = "GPU_I_PROFILE"
MIG_INSTANCE_ID = "GPU_I_ID"
HOSTNAME = "Hostname"
NEW_HOSTNAME = "hostname"
"""How dcgm-exporter names the host label since May 2026."""
NAMESPACE = "namespace"
POD = "pod"
CONTAINER = "container"
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"

UNKNOWN_XID = "Unknown Error"

# Meaning of the XID codes seen on data-centre GPUs, from NVIDIA's public XID catalogue
# (https://docs.nvidia.com/deploy/xid-errors/), spelled as dcgm-exporter spells them in its
# ``err_msg`` label. Codes not listed here get ``Unknown Error``; alert rules should key on
# ``err_code``, which is always exact.
XID_MESSAGES: Mapping[int, str] = {
    0: "No Error",
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing",
    44: "Graphics Engine fault during context switch",
    45: (
        "Preemptive cleanup, due to previous errors -- "
        "Most likely to see when running multiple cuda"
    ),
    48: "Double Bit ECC Error",
    54: "Auxiliary power is not connected to the GPU board",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    122: "SPI PMU RPC Read Failure",
    123: "SPI PMU RPC Write Failure",
    136: "ALI Training Fail",
    137: "NVLink Privilege Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    144: "NVLINK: Saw Error",
    145: "NVLINK: RLW Error",
    146: "NVLINK: TLW Error",
    147: "NVLINK: TREX Error",
    148: "NVLINK: NVLPW_CTRL Error",
    149: "NVLINK: NETIR Error",
    150: "NVLINK: MSE Error",
    154: "GPU Recovery Action Changed",
    155: "NVLINK: SW Defined Error",
    156: "Resource Retirement Event",
    157: "Resource Retirement Failure",
    158: "GPU Fatal Timeout",
}


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What names a physical GPU in labels. ``gpu`` is DCGM's GPU id or NVML's index."""

    gpu: str
    uuid: str
    pci_bus_id: str
    device: str
    model_name: str


@dataclass(frozen=True, slots=True)
class MigIdentity:
    """A MIG GPU instance: ``profile`` as ``1g.10gb``, ``instance_id`` NVML's GPU instance id."""

    profile: str
    instance_id: str


def device_name(number: int | str) -> str:
    return f"nvidia{number}"


def gpu_labels(
    identity: GpuIdentity,
    hostname: str,
    *,
    mig: MigIdentity | None = None,
    extra: Mapping[str, str] | None = None,
    attributes: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Labels of one GPU (or MIG instance) series in dcgm-exporter's order.

    ``extra`` holds label-type fields (``DCGM_FI_DRIVER_VERSION``); ``attributes`` holds
    per-metric labels such as the XID ``err_code``/``err_msg``. Neither may override the
    identity labels: a CSV row named ``gpu`` must not relabel the series.
    """
    labels = {
        GPU: identity.gpu,
        UUID: identity.uuid,
        PCI_BUS_ID: identity.pci_bus_id,
        DEVICE: identity.device,
        MODEL_NAME: identity.model_name,
    }
    if mig is not None:
        labels[MIG_PROFILE] = mig.profile
        labels[MIG_INSTANCE_ID] = mig.instance_id
    if hostname:
        labels[HOSTNAME] = hostname
    for source in (extra or {}), (attributes or {}):
        for key, value in source.items():
            labels.setdefault(key, value)
    return present(labels)


def present(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` without the empty ones, which Prometheus drops (``pod=""`` is no pod)."""
    return {name: value for name, value in labels.items() if value != ""}


def normalize_host(labels: dict[str, str]) -> dict[str, str]:
    """dcgm-exporter's post-May-2026 ``hostname`` renamed to the vocabulary's ``Hostname``, in
    its place in the label order; a series that carries both keeps both (its ``Hostname`` is
    the host)."""
    if NEW_HOSTNAME not in labels or HOSTNAME in labels:
        return labels
    return {(HOSTNAME if name == NEW_HOSTNAME else name): value for name, value in labels.items()}


def xid_attributes(code: int) -> dict[str, str]:
    """``err_code`` and ``err_msg`` as dcgm-exporter adds them to ``DCGM_FI_DEV_XID_ERRORS``."""
    return {"err_code": str(code), "err_msg": XID_MESSAGES.get(code, UNKNOWN_XID)}


def mig_profile_from_name(name: str) -> str:
    """``NVIDIA H100 80GB HBM3 MIG 1g.10gb`` (NVML's MIG device name) -> ``1g.10gb``.

    DCGM reports the bare profile as the GPU instance's name already; NVML prefixes it with the
    parent's model and ``MIG``. A name without ``MIG`` is returned stripped, unchanged.
    """
    marker = "MIG "
    position = name.rfind(marker)
    return name[position + len(marker) :].strip() if position >= 0 else name.strip()


def as_text(value: object) -> str:
    """NVML and DCGM bindings return ``bytes`` from some versions and ``str`` from others."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    return str(value)
