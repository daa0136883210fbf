"""Host network, disk I/O and CPU iowait counters through psutil.

Metric names follow node-exporter's, so dashboards and alert rules written for it apply.
All are monotonically increasing counters; rates are computed at query time.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import datetime
from types import ModuleType
from typing import Any

from collector.points import Point
from collector.sources.gpu_labels import HOSTNAME
from tuneloop.storage.timeseries.types import SeriesKind

_NET_FIELDS = {
    "bytes_recv": "node_network_receive_bytes_total",
    "bytes_sent": "node_network_transmit_bytes_total",
    "packets_recv": "node_network_receive_packets_total",
    "packets_sent": "node_network_transmit_packets_total",
    "errin": "node_network_receive_errs_total",
    "errout": "node_network_transmit_errs_total",
    "dropin": "node_network_receive_drop_total",
    "dropout": "node_network_transmit_drop_total",
}

_DISK_FIELDS = {
    "read_bytes": "node_disk_read_bytes_total",
    "write_bytes": "node_disk_written_bytes_total",
    "read_count": "node_disk_reads_completed_total",
    "write_count": "node_disk_writes_completed_total",
}


class HostSource:
    name = "host"

    def __init__(self, psutil_module: ModuleType | None = None, hostname: str | None = None):
        if psutil_module is None:
            import psutil as psutil_module
        self._psutil: Any = psutil_module
        self._hostname = hostname or socket.gethostname()

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def collect(self, now: datetime) -> Iterator[Point]:
        yield from self._network(now)
        yield from self._disks(now)
        yield from self._iowait(now)

    def _counter(self, metric: str, labels: dict[str, str], now: datetime, value: float) -> Point:
        return Point(
            metric, {**labels, HOSTNAME: self._hostname}, now, float(value), SeriesKind.COUNTER
        )

    def _network(self, now: datetime) -> Iterator[Point]:
        for device, counters in self._psutil.net_io_counters(pernic=True).items():
            for field, metric in _NET_FIELDS.items():
                yield self._counter(metric, {"device": device}, now, getattr(counters, field))

    def _disks(self, now: datetime) -> Iterator[Point]:
        # perdisk=True raises on hosts without disk stats (some containers); keep the rest.
        try:
            disks = self._psutil.disk_io_counters(perdisk=True) or {}
        except (OSError, RuntimeError):
            return
        for device, counters in disks.items():
            for field, metric in _DISK_FIELDS.items():
                yield self._counter(metric, {"device": device}, now, getattr(counters, field))

    def _iowait(self, now: datetime) -> Iterator[Point]:
        for cpu, times in enumerate(self._psutil.cpu_times(percpu=True)):
            iowait = getattr(times, "iowait", None)
            if iowait is not None:
                labels = {"cpu": str(cpu), "mode": "iowait"}
                yield self._counter("node_cpu_seconds_total", labels, now, iowait)
