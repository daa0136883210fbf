"""Metric sources. Every source follows :class:`collector.sources.base.Source`.

``build_sources`` turns a configured list such as ``["host", "nvml", "infiniband",
"scrape=http://gpu-node-1:9400/metrics"]`` into source objects:

===============================  ===============================================================
``host``                         psutil network/disk/iowait counters (HostSource)
``nvml``                         GPUs through NVML (NvmlSource), where no DCGM host engine runs
``dcgm`` / ``dcgm=HOST[:PORT]``  GPUs through a DCGM host engine (DcgmSource), local by default
``scrape=URL``                   a dcgm-exporter / node-exporter ``/metrics`` (ScrapeSource)
``infiniband`` / ``=PATH``       InfiniBand port counters from sysfs (InfinibandSource)
===============================  ===============================================================

The ``sources`` setting also takes ``auto`` (see :mod:`collector.sources.auto`), which the
collector service expands before calling ``build_sources``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from collector.sources.base import Source
from tuneloop.errors import InvalidInput

SOURCE_KINDS = ("host", "nvml", "dcgm", "scrape", "infiniband")


class SourceSpecError(InvalidInput):
    """A source entry names no known source, lacks a required value, or repeats another."""


def build_sources(
    spec: Iterable[str],
    *,
    hostname: str | None = None,
    dcgm_bindings_path: str | os.PathLike[str] | None = None,
    dcgm_fields_csv: str | os.PathLike[str] | None = None,
    scrape_timeout_s: float = 5.0,
    dcgm_update_interval_s: float = 10.0,
) -> list[Source]:
    """Source objects for entries ``NAME`` or ``NAME=VALUE``; raises SourceSpecError on the
    first bad entry (configuration errors fail at start-up, before anything is collected).

    ``dcgm_update_interval_s`` is how often DCGM samples its fields: polling it more often
    than that would read the same values again."""
    sources: list[Source] = []
    names: set[str] = set()
    for raw in spec:
        entry = raw.strip()
        kind, _, value = entry.partition("=")
        kind, value = kind.strip().lower(), value.strip()
        source = _build_one(
            kind,
            value,
            entry=raw,
            hostname=hostname,
            dcgm_bindings_path=dcgm_bindings_path,
            dcgm_fields_csv=dcgm_fields_csv,
            scrape_timeout_s=scrape_timeout_s,
            dcgm_update_interval_s=dcgm_update_interval_s,
        )
        if source.name in names:
            raise SourceSpecError(f"source {source.name!r} is configured twice")
        names.add(source.name)
        sources.append(source)
    return sources


def _build_one(
    kind: str,
    value: str,
    *,
    entry: str,
    hostname: str | None,
    dcgm_bindings_path: str | os.PathLike[str] | None,
    dcgm_fields_csv: str | os.PathLike[str] | None,
    scrape_timeout_s: float,
    dcgm_update_interval_s: float,
) -> Source:
    # Imports stay local so configuring "host" alone does not import httpx or the GPU code.
    if kind == "host" and not value:
        from collector.sources.host import HostSource

        return HostSource(hostname=hostname)
    if kind == "nvml" and not value:
        from collector.sources.nvml import NvmlSource

        return NvmlSource(hostname=hostname)
    if kind == "dcgm":
        from collector.sources.dcgm import DcgmSource

        return DcgmSource(
            bindings_path=dcgm_bindings_path,
            fields_csv=dcgm_fields_csv,
            hostname=hostname,
            host_engine=value or "localhost",
            update_interval_s=dcgm_update_interval_s,
        )
    if kind == "scrape":
        if not value:
            raise SourceSpecError(
                f"{entry!r}: scrape needs a URL, as scrape=http://host:9400/metrics"
            )
        from collector.sources.scrape import ScrapeSource

        try:
            return ScrapeSource(value, timeout_s=scrape_timeout_s)
        except ValueError as exc:
            raise SourceSpecError(f"{entry!r}: {exc}") from exc
    if kind == "infiniband":
        from collector.sources.infiniband import DEFAULT_SYSFS_ROOT, InfinibandSource

        return InfinibandSource(sysfs_root=value or DEFAULT_SYSFS_ROOT, hostname=hostname)
    if kind in SOURCE_KINDS:
        raise SourceSpecError(f"{entry!r}: {kind} takes no value")
    raise SourceSpecError(f"{entry!r}: unknown source; known: {', '.join(SOURCE_KINDS)}")
