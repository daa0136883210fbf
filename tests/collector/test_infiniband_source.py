"""InfinibandSource on a fake /sys/class/infiniband tree (values from a ConnectX-7 HCA)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from collector.points import Point
from collector.sources.infiniband import InfinibandSource
from tuneloop.storage.timeseries.types import SeriesKind

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def fake_sysfs(root: Path) -> Path:
    ib = root / "class" / "infiniband"
    write(ib, "mlx5_0/board_id", "MT_0000000838")
    write(ib, "mlx5_0/fw_ver", "28.39.1002")
    write(ib, "mlx5_0/hca_type", "MT4129")
    port = "mlx5_0/ports/1"
    write(ib, f"{port}/state", "4: ACTIVE")
    write(ib, f"{port}/phys_state", "5: LinkUp")
    write(ib, f"{port}/rate", "400 Gb/sec (4X NDR)")
    counters = {
        "port_xmit_data": "18304708544512",  # 4-byte words
        "port_rcv_data": "18247531808768",
        "port_xmit_packets": "9876543210",
        "port_rcv_packets": "9812345678",
        "port_rcv_errors": "0",
        "symbol_error": "3",
        "link_downed": "1",
        "port_xmit_wait": "120034",
        "VL15_dropped": "0",
        "unicast_xmit_packets": "9876000000",
    }
    for name, value in counters.items():
        write(ib, f"{port}/counters/{name}", value)
    write(ib, f"{port}/hw_counters/out_of_buffer", "17")
    write(ib, f"{port}/hw_counters/np_cnp_sent", "52011")
    write(ib, f"{port}/hw_counters/lifespan", "12")
    # A second HCA whose PMA is not readable: counters say so instead of a number.
    write(ib, "mlx5_1/ports/1/state", "1: DOWN")
    write(ib, "mlx5_1/ports/1/counters/port_xmit_data", "N/A (no PMA)")
    write(ib, "mlx5_1/ports/1/counters/port_rcv_data", "")
    write(ib, "mlx5_1/ports/1/counters/link_downed", "0")
    return ib


def one(points: list[Point], metric: str, device: str = "mlx5_0") -> Point:
    matches = [p for p in points if p.metric == metric and p.labels["device"] == device]
    assert len(matches) == 1, (metric, device, matches)
    return matches[0]


def test_port_counters_follow_node_exporter(tmp_path: Path) -> None:
    source = InfinibandSource(fake_sysfs(tmp_path), hostname="gpu-node-17")
    points = source.collect(NOW)

    received = one(points, "node_infiniband_port_data_received_bytes_total")
    assert received.value == 18247531808768 * 4  # words to bytes
    assert received.kind is SeriesKind.COUNTER
    assert dict(received.labels) == {"device": "mlx5_0", "port": "1", "Hostname": "gpu-node-17"}
    assert one(points, "node_infiniband_port_data_transmitted_bytes_total").value == (
        18304708544512 * 4
    )
    assert one(points, "node_infiniband_port_packets_received_total").value == 9812345678
    assert one(points, "node_infiniband_symbol_error_total").value == 3
    assert one(points, "node_infiniband_link_downed_total").value == 1
    assert one(points, "node_infiniband_vl15_dropped_total").value == 0
    assert one(points, "node_infiniband_port_transmit_wait_total").value == 120034
    assert one(points, "node_infiniband_out_of_buffer_drops_total").value == 17
    assert one(points, "node_infiniband_np_cnp_packets_sent_total").value == 52011
    assert one(points, "node_infiniband_lifespan_seconds").value == 0.012
    assert one(points, "node_infiniband_state_id").value == 4
    assert one(points, "node_infiniband_physical_state_id").value == 5
    assert one(points, "node_infiniband_rate_bytes_per_second").value == 50_000_000_000
    info = one(points, "node_infiniband_info")
    assert (info.labels["firmware_version"], info.labels["hca_type"], info.value) == (
        "28.39.1002",
        "MT4129",
        1.0,
    )
    counters = [p for p in points if p.metric.endswith("_total")]
    assert counters and all(p.kind is SeriesKind.COUNTER for p in counters)
    assert all(p.ts == NOW for p in points)


def test_unreadable_counters_are_skipped_not_fatal(tmp_path: Path) -> None:
    points = InfinibandSource(fake_sysfs(tmp_path), hostname="h").collect(NOW)
    mlx5_1 = {p.metric for p in points if p.labels["device"] == "mlx5_1"}
    assert "node_infiniband_port_data_transmitted_bytes_total" not in mlx5_1  # "N/A (no PMA)"
    assert "node_infiniband_port_data_received_bytes_total" not in mlx5_1  # empty file
    assert one(points, "node_infiniband_link_downed_total", "mlx5_1").value == 0
    assert one(points, "node_infiniband_state_id", "mlx5_1").value == 1


def test_host_without_infiniband_yields_nothing(tmp_path: Path) -> None:
    assert InfinibandSource(tmp_path / "absent", hostname="h").collect(NOW) == []
    (tmp_path / "empty").mkdir()
    assert InfinibandSource(tmp_path / "empty", hostname="h").collect(NOW) == []


def test_device_without_ports_reports_only_its_info(tmp_path: Path) -> None:
    write(tmp_path, "bnxt_re0/fw_ver", "227.1.111.0")
    points = InfinibandSource(tmp_path, hostname="h").collect(NOW)
    assert [p.metric for p in points] == ["node_infiniband_info"]
