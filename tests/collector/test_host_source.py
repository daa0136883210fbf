from __future__ import annotations

from collections import namedtuple
from datetime import UTC, datetime
from types import SimpleNamespace

import psutil

from collector.sources.host import HostSource
from tuneloop.storage.timeseries.types import SeriesKind

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

# Shapes of psutil's own named tuples, with values recorded on a real host.
NetIO = namedtuple(
    "NetIO",
    "bytes_sent bytes_recv packets_sent packets_recv errin errout dropin dropout",
)
DiskIO = namedtuple("DiskIO", "read_count write_count read_bytes write_bytes")
CpuTimes = namedtuple("CpuTimes", "user system idle iowait")


def recorded_psutil(disks_fail: bool = False) -> SimpleNamespace:
    def disk_io_counters(perdisk: bool) -> dict[str, DiskIO]:
        if disks_fail:
            raise RuntimeError("couldn't find any physical disk")
        return {"nvme0n1": DiskIO(120, 340, 4_096_000, 8_192_000)}

    return SimpleNamespace(
        net_io_counters=lambda pernic: {
            "eth0": NetIO(1000, 2000, 10, 20, 0, 1, 2, 3),
            "ib0": NetIO(5, 6, 7, 8, 0, 0, 0, 0),
        },
        disk_io_counters=disk_io_counters,
        cpu_times=lambda percpu: [CpuTimes(1.0, 2.0, 3.0, 0.25), CpuTimes(1.0, 2.0, 3.0, 0.5)],
    )


def test_host_source_emits_node_exporter_counters_per_device() -> None:
    points = list(HostSource(recorded_psutil(), hostname="gpu-node-1").collect(NOW))
    by_key = {(p.metric, p.labels.get("device", p.labels.get("cpu"))): p for p in points}

    assert by_key[("node_network_receive_bytes_total", "eth0")].value == 2000
    assert by_key[("node_network_transmit_bytes_total", "eth0")].value == 1000
    assert by_key[("node_network_receive_drop_total", "eth0")].value == 2
    assert by_key[("node_disk_written_bytes_total", "nvme0n1")].value == 8_192_000
    assert by_key[("node_disk_reads_completed_total", "nvme0n1")].value == 120
    assert by_key[("node_cpu_seconds_total", "1")].value == 0.5
    assert all(p.kind is SeriesKind.COUNTER for p in points)
    assert all(p.labels["Hostname"] == "gpu-node-1" and p.ts == NOW for p in points)
    assert len(points) == 2 * 8 + 4 + 2


def test_host_source_keeps_the_rest_when_disk_stats_fail() -> None:
    points = list(HostSource(recorded_psutil(disks_fail=True), hostname="h").collect(NOW))
    metrics = {p.metric for p in points}
    assert "node_network_receive_bytes_total" in metrics
    assert not any(m.startswith("node_disk_") for m in metrics)


def test_host_source_reads_this_machine() -> None:
    points = list(HostSource().collect(NOW))
    assert any(p.metric == "node_network_receive_bytes_total" for p in points)
    assert all(p.value >= 0 for p in points)
    assert psutil.net_io_counters() is not None
