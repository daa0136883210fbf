"""InfiniBand port counters from sysfs, named like node-exporter's infiniband collector.

Reads ``<root>/<device>/ports/<port>/counters/*`` (IB PMA counters) and ``.../hw_counters/*``
(mlx5 extras) where present. ``port_xmit_data``/``port_rcv_data`` count 4-byte words per the IB
spec, so they are multiplied by 4 into bytes, as node-exporter does. What is read is the
``sysfs_root`` constructor argument, so tests point it at a fake tree. A host without
``/sys/class/infiniband`` yields no points; an unreadable file skips that one counter.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from collector.points import Point
from collector.sources.gpu_labels import HOSTNAME, present
from tuneloop.storage.timeseries.types import SeriesKind

log = logging.getLogger(__name__)

DEFAULT_SYSFS_ROOT = "/sys/class/infiniband"
PREFIX = "node_infiniband_"

# counters/<file> -> (metric name without prefix, multiplier)
PORT_COUNTERS: dict[str, tuple[str, int]] = {
    "excessive_buffer_overrun_errors": ("excessive_buffer_overrun_errors_total", 1),
    "link_downed": ("link_downed_total", 1),
    "link_error_recovery": ("link_error_recovery_total", 1),
    "local_link_integrity_errors": ("local_link_integrity_errors_total", 1),
    "multicast_rcv_packets": ("multicast_packets_received_total", 1),
    "multicast_xmit_packets": ("multicast_packets_transmitted_total", 1),
    "port_rcv_constraint_errors": ("port_constraint_errors_received_total", 1),
    "port_xmit_constraint_errors": ("port_constraint_errors_transmitted_total", 1),
    "port_rcv_data": ("port_data_received_bytes_total", 4),
    "port_xmit_data": ("port_data_transmitted_bytes_total", 4),
    "port_rcv_discards": ("port_discards_received_total", 1),
    "port_xmit_discards": ("port_discards_transmitted_total", 1),
    "port_rcv_errors": ("port_errors_received_total", 1),
    "port_rcv_packets": ("port_packets_received_total", 1),
    "port_xmit_packets": ("port_packets_transmitted_total", 1),
    "port_xmit_wait": ("port_transmit_wait_total", 1),
    "unicast_rcv_packets": ("unicast_packets_received_total", 1),
    "unicast_xmit_packets": ("unicast_packets_transmitted_total", 1),
    "port_rcv_remote_physical_errors": ("port_receive_remote_physical_errors_total", 1),
    "port_rcv_switch_relay_errors": ("port_receive_switch_relay_errors_total", 1),
    "symbol_error": ("symbol_error_total", 1),
    "VL15_dropped": ("vl15_dropped_total", 1),
    # Older drivers' 64-bit variants, which node-exporter reports as legacy_*.
    "port_multicast_rcv_packets": ("legacy_multicast_packets_received_total", 1),
    "port_multicast_xmit_packets": ("legacy_multicast_packets_transmitted_total", 1),
    "port_rcv_data_64": ("legacy_data_received_bytes_total", 4),
    "port_xmit_data_64": ("legacy_data_transmitted_bytes_total", 4),
    "port_rcv_packets_64": ("legacy_packets_received_total", 1),
    "port_xmit_packets_64": ("legacy_packets_transmitted_total", 1),
    "port_unicast_rcv_packets": ("legacy_unicast_packets_received_total", 1),
    "port_unicast_xmit_packets": ("legacy_unicast_packets_transmitted_total", 1),
}

# hw_counters/<file> -> metric name without prefix (all counters)
HW_COUNTERS: dict[str, str] = {
    "duplicate_request": "duplicate_requests_packets_total",
    "implied_nak_seq_err": "implied_nak_seq_errors_total",
    "local_ack_timeout_err": "local_ack_timeout_errors_total",
    "np_cnp_sent": "np_cnp_packets_sent_total",
    "np_ecn_marked_roce_packets": "np_ecn_marked_roce_packets_received_total",
    "out_of_buffer": "out_of_buffer_drops_total",
    "out_of_sequence": "out_of_sequence_packets_received_total",
    "packet_seq_err": "packet_sequence_errors_total",
    "req_cqe_error": "req_cqes_errors_total",
    "req_cqe_flush_error": "req_cqes_flush_errors_total",
    "req_remote_access_errors": "req_remote_access_errors_total",
    "req_remote_invalid_request": "req_remote_invalid_request_errors_total",
    "resp_cqe_error": "resp_cqes_errors_total",
    "resp_cqe_flush_error": "resp_cqes_flush_errors_total",
    "resp_local_length_error": "resp_local_length_errors_total",
    "resp_remote_access_errors": "resp_remote_access_errors_total",
    "rnr_nak_retry_err": "rnr_nak_retry_packets_received_total",
    "roce_adp_retrans": "roce_adp_retransmits_total",
    "roce_adp_retrans_to": "roce_adp_retransmits_timeout_total",
    "roce_slow_restart": "roce_slow_restart_used_total",
    "roce_slow_restart_cnps": "roce_slow_restart_cnps_total",
    "roce_slow_restart_trans": "roce_slow_restart_total",
    "rp_cnp_handled": "rp_cnp_packets_handled_total",
    "rp_cnp_ignored": "rp_cnp_ignored_packets_received_total",
    "rx_atomic_requests": "rx_atomic_requests_total",
    "rx_dct_connect": "rx_dct_connect_requests_total",
    "rx_read_requests": "rx_read_requests_total",
    "rx_write_requests": "rx_write_requests_total",
    "rx_icrc_encapsulated": "rx_icrc_encapsulated_errors_total",
}

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_GBIT_TO_BYTES = 125_000_000  # 1 Gb/s in bytes/s


class InfinibandSource:
    name = "infiniband"

    def __init__(
        self, sysfs_root: str | Path = DEFAULT_SYSFS_ROOT, hostname: str | None = None
    ) -> None:
        self._root = Path(sysfs_root)
        self._hostname = hostname or socket.gethostname()

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def collect(self, now: datetime) -> list[Point]:
        if not self._root.is_dir():
            return []
        points: list[Point] = []
        for device in _sorted_dirs(self._root):
            try:
                points.extend(self._device(device, now))
            except OSError as exc:  # a device vanishing mid-read (driver reload) skips it
                log.warning("infiniband %s unreadable: %s", device.name, exc)
        return points

    def _device(self, device: Path, now: datetime) -> Iterator[Point]:
        info = present(
            {
                "device": device.name,
                "board_id": _read_text(device / "board_id") or "",
                "firmware_version": _read_text(device / "fw_ver") or "",
                "hca_type": _read_text(device / "hca_type") or "",
                HOSTNAME: self._hostname,
            }
        )
        yield Point(PREFIX + "info", info, now, 1.0, SeriesKind.GAUGE)
        ports = device / "ports"
        if not ports.is_dir():
            return
        for port in sorted(_sorted_dirs(ports), key=_port_order):
            labels = {"device": device.name, "port": port.name, HOSTNAME: self._hostname}
            yield from self._port_state(port, labels, now)
            for filename, (metric, multiplier) in PORT_COUNTERS.items():
                value = _read_uint(port / "counters" / filename)
                if value is not None:
                    yield Point(
                        PREFIX + metric, labels, now, float(value * multiplier), SeriesKind.COUNTER
                    )
            for filename, metric in HW_COUNTERS.items():
                value = _read_uint(port / "hw_counters" / filename)
                if value is not None:
                    yield Point(PREFIX + metric, labels, now, float(value), SeriesKind.COUNTER)
            lifespan_ms = _read_uint(port / "hw_counters" / "lifespan")
            if lifespan_ms is not None:
                yield Point(
                    PREFIX + "lifespan_seconds", labels, now, lifespan_ms / 1000, SeriesKind.GAUGE
                )

    @staticmethod
    def _port_state(port: Path, labels: dict[str, str], now: datetime) -> Iterator[Point]:
        # "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)"
        for filename, metric in (("state", "state_id"), ("phys_state", "physical_state_id")):
            text = _read_text(port / filename)
            if text and text.split(":", 1)[0].strip().isdigit():
                state = float(text.split(":", 1)[0])
                yield Point(PREFIX + metric, labels, now, state, SeriesKind.GAUGE)
        rate = _RATE.match(_read_text(port / "rate") or "")
        if rate:
            bytes_per_second = float(rate.group(1)) * _GBIT_TO_BYTES
            yield Point(PREFIX + "rate_bytes_per_second", labels, now, bytes_per_second)


def _sorted_dirs(path: Path) -> list[Path]:
    try:
        return sorted(child for child in path.iterdir() if child.is_dir())
    except OSError:
        return []


def _port_order(port: Path) -> tuple[int, str]:
    return (int(port.name), port.name) if port.name.isdigit() else (1 << 30, port.name)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _read_uint(path: Path) -> int | None:
    """A sysfs counter; None when absent or not a number ("N/A (no PMA)" on some ports)."""
    text = _read_text(path)
    if not text:
        return None
    try:
        value = int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return None
    return value if value >= 0 else None
