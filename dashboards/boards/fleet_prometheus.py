"""The Fleet dashboard in PromQL, for a Prometheus that scrapes dcgm-exporter and node-exporter."""

from __future__ import annotations

from dashboards.board import Board, promql_variable, timeseries


def fleet_prometheus() -> Board:
    gpu = 'hostname=~"$host", gpu=~"$gpu"'
    legend = "{{hostname}} gpu {{gpu}}"
    board = Board(
        "tuneloop-fleet-prometheus",
        "Fleet (Prometheus)",
        "The Fleet dashboard in PromQL, for a Prometheus that scrapes dcgm-exporter and "
        "node-exporter, or tuneloop's project view (/api/v1/projects/NAME/metrics).",
        variables=[
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
            },
            promql_variable("host", "Host", "label_values(DCGM_FI_DEV_GPU_UTIL, hostname)"),
            promql_variable(
                "gpu", "GPU", 'label_values(DCGM_FI_DEV_GPU_UTIL{hostname=~"$host"}, gpu)'
            ),
        ],
    )
    gauges = (
        ("GPU utilization", "DCGM_FI_DEV_GPU_UTIL", "percent"),
        ("GPU memory used", "DCGM_FI_DEV_FB_USED", "decmbytes"),
        ("Power draw", "DCGM_FI_DEV_POWER_USAGE", "watt"),
        ("GPU temperature", "DCGM_FI_DEV_GPU_TEMP", "celsius"),
        ("SM clock (a drop under load is throttling)", "DCGM_FI_DEV_SM_CLOCK", "rotmhz"),
        ("Last XID error code", "DCGM_FI_DEV_XID_ERRORS", "none"),
    )
    for title, metric, unit in gauges:
        board.add_promql(title, (f"{metric}{{{gpu}}}", legend), **timeseries(unit))
    board.add_promql(
        "Energy use (from the energy counter)",
        (
            f"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{gpu}}}[$__rate_interval]) / 1000",
            legend,
        ),
        **timeseries("watt"),
    )
    board.add_promql(
        "Remapped rows and PCIe replays",
        (f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{gpu}}}", legend + " remapped"),
        (f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{gpu}}}", legend + " replays"),
        **timeseries("none"),
    )
    host = 'hostname=~"$host"'
    board.add_promql(
        "Network I/O per host and interface",
        (
            f"rate(node_network_receive_bytes_total{{{host}}}[$__rate_interval])",
            "{{hostname}} {{device}} rx",
        ),
        (
            f"rate(node_network_transmit_bytes_total{{{host}}}[$__rate_interval])",
            "{{hostname}} {{device}} tx",
        ),
        **timeseries("Bps"),
    )
    board.add_promql(
        "Disk I/O per host and device",
        (
            f"rate(node_disk_read_bytes_total{{{host}}}[$__rate_interval])",
            "{{hostname}} {{device}} read",
        ),
        (
            f"rate(node_disk_written_bytes_total{{{host}}}[$__rate_interval])",
            "{{hostname}} {{device}} written",
        ),
        **timeseries("Bps"),
    )
    return board
