"""``auto``: the sources worth polling on this machine.

* ``host`` always;
* ``infiniband`` when ``/sys/class/infiniband`` exists;
* one GPU source: ``dcgm`` when a DCGM host engine answers on localhost:5555 (it serves
  profiling fields NVML lacks, and several readers share its one sampling), else ``nvml`` when
  the NVML library loads and reports at least one GPU, else none.

Probing is cheap and touches no DCGM bindings: a TCP connect for DCGM, ``nvmlInit`` and a
device count (then ``nvmlShutdown``) for NVML. What is probed is passed in, so tests point the
probes at a listening socket, a temporary directory and a fake NVML module.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from collector.sources.infiniband import DEFAULT_SYSFS_ROOT

AUTO: Final = "auto"
DCGM_PORT: Final = 5555
"""nv-hostengine's default port."""
PROBE_TIMEOUT_S: Final = 0.5
_GPU_KINDS: Final = frozenset({"nvml", "dcgm"})


@dataclass(frozen=True, slots=True)
class Detection:
    specs: tuple[str, ...]
    """What ``auto`` stands for here, in order: host first."""
    gpu_source: str | None
    """``"dcgm"``, ``"nvml"`` or ``None``."""
    gpu_reason: str
    """Why that GPU source (or none) was chosen, for the start-up log."""


def dcgm_answers(
    host: str = "localhost", port: int = DCGM_PORT, timeout_s: float = PROBE_TIMEOUT_S
) -> bool:
    """Whether something accepts TCP connections at ``host:port`` (nv-hostengine does)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def nvml_gpu_count(nvml: Any = None) -> tuple[int, str]:
    """(GPUs NVML reports, why 0 if so). Never raises: any failure means "no NVML GPU"."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return 0, "nvidia-ml-py is not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, OSError...
        return 0, f"NVML did not load ({_one_line(exc)})"
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        return 0, f"NVML could not count GPUs ({_one_line(exc)})"
    finally:
        # The probe's own session; a failure to end it changes nothing about the answer.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return count, "" if count else "NVML reports no GPU"


def detect_sources(
    *,
    infiniband_root: str | Path = DEFAULT_SYSFS_ROOT,
    dcgm_host: str = "localhost",
    dcgm_port: int = DCGM_PORT,
    nvml: Any = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> Detection:
    specs = ["host"]
    if Path(infiniband_root).is_dir():
        specs.append("infiniband")
    where = f"{dcgm_host}:{dcgm_port}"
    if dcgm_answers(dcgm_host, dcgm_port, timeout_s):
        specs.append("dcgm")
        return Detection(tuple(specs), "dcgm", f"a DCGM host engine answers on {where}")
    count, why_not = nvml_gpu_count(nvml)
    if count:
        specs.append("nvml")
        return Detection(
            tuple(specs),
            "nvml",
            f"no DCGM host engine on {where}; NVML reports {count} GPU{'s' * (count > 1)}",
        )
    return Detection(tuple(specs), None, f"no DCGM host engine on {where}; {why_not}")


def expand_auto(specs: Sequence[str], detection: Detection) -> list[str]:
    """``specs`` with ``auto`` replaced by what it detected, less the kinds also given
    explicitly (``auto,infiniband=/x`` reads InfiniBand from /x only; ``auto,dcgm=node:5555``
    adds no local GPU source), so that auto never configures a source twice."""
    explicit = [spec for spec in specs if spec.strip().lower() != AUTO]
    given = {kind_of(spec) for spec in explicit}
    if given & _GPU_KINDS:
        given |= _GPU_KINDS
    expanded: list[str] = []
    for spec in specs:
        if spec.strip().lower() == AUTO:
            expanded += [found for found in detection.specs if kind_of(found) not in given]
        else:
            expanded.append(spec)
    return expanded


def uses_auto(specs: Sequence[str]) -> bool:
    return any(spec.strip().lower() == AUTO for spec in specs)


def kind_of(spec: str) -> str:
    """The source kind a spec (``scrape=URL``) or source name (``scrape:URL``) is of."""
    return spec.strip().lower().partition("=")[0].partition(":")[0].strip()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
