"""The Fleet dashboard: every GPU of a project at a glance, from the store."""

from __future__ import annotations

from dashboards.board import PROJECT_VARIABLE, Board, query_variable, timeseries
from dashboards.panel_sql import GPU_FILTER, GPU_NAME, counter_rate_sql, gauge_sql


def fleet() -> Board:
    gpu_series = (
        "SELECT DISTINCT labels->>'{label}' FROM series AS s JOIN projects AS p "
        "ON p.id = s.project_id WHERE p.name = ${{project:sqlstring}} "
        "AND s.metric = 'DCGM_FI_DEV_GPU_UTIL'{extra} ORDER BY 1"
    )
    host_series = (
        "SELECT DISTINCT labels->>'Hostname' FROM series AS s JOIN projects AS p "
        "ON p.id = s.project_id WHERE p.name = ${project:sqlstring} "
        "AND (s.metric = 'DCGM_FI_DEV_GPU_UTIL' OR s.metric LIKE 'node%') ORDER BY 1"
    )
    board = Board(
        "tuneloop-fleet",
        "Fleet",
        "The GPU fleet at a glance: utilization, memory, power, temperature, clocks and "
        "errors per host and GPU (dcgm-exporter names), network and disk I/O per host.",
        variables=[
            PROJECT_VARIABLE,
            query_variable("host", "Host", host_series, multi=True, refresh=2),
            query_variable(
                "gpu",
                "GPU",
                gpu_series.format(
                    label="gpu", extra=" AND labels->>'Hostname' IN (${host:sqlstring})"
                ),
                multi=True,
                refresh=2,
            ),
        ],
    )
    board.add(
        "timeseries",
        "GPU utilization",
        gauge_sql("DCGM_FI_DEV_GPU_UTIL", GPU_NAME, GPU_FILTER),
        **timeseries("percent"),
    )
    board.add(
        "timeseries",
        "GPU memory used",
        gauge_sql("DCGM_FI_DEV_FB_USED", GPU_NAME, GPU_FILTER),
        **timeseries("decmbytes"),
    )
    board.add(
        "timeseries",
        "Power draw",
        gauge_sql("DCGM_FI_DEV_POWER_USAGE", GPU_NAME, GPU_FILTER),
        **timeseries("watt"),
    )
    board.add(
        "timeseries",
        "GPU temperature (max)",
        gauge_sql("DCGM_FI_DEV_GPU_TEMP", GPU_NAME, GPU_FILTER, "max"),
        **timeseries("celsius"),
    )
    board.add(
        "timeseries",
        "SM clock (min; a drop under load is throttling)",
        gauge_sql("DCGM_FI_DEV_SM_CLOCK", GPU_NAME, GPU_FILTER, "min"),
        **timeseries("rotmhz"),
    )
    board.add(
        "timeseries",
        "Clock event reasons (bitmask, max)",
        gauge_sql("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", GPU_NAME, GPU_FILTER, "max"),
        **timeseries("none"),
    )
    board.add(
        "timeseries",
        "Last XID error code",
        gauge_sql("DCGM_FI_DEV_XID_ERRORS", GPU_NAME, GPU_FILTER, "max"),
        **timeseries("none"),
    )
    board.add(
        "timeseries",
        "Remapped rows and PCIe replays",
        gauge_sql(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            GPU_NAME + " || ' remapped'",
            GPU_FILTER,
            "max",
        ),
        gauge_sql(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU_NAME + " || ' replays'", GPU_FILTER, "max"
        ),
        **timeseries("none"),
    )
    host_filter = "labels->>'Hostname' IN (${host:sqlstring})"
    device = "(labels->>'Hostname') || ' ' || (labels->>'device')"
    board.add(
        "timeseries",
        "Network I/O per host and interface",
        counter_rate_sql("node_network_receive_bytes_total", device + " || ' rx'", host_filter),
        counter_rate_sql("node_network_transmit_bytes_total", device + " || ' tx'", host_filter),
        **timeseries("Bps"),
    )
    board.add(
        "timeseries",
        "Disk I/O per host and device",
        counter_rate_sql("node_disk_read_bytes_total", device + " || ' read'", host_filter),
        counter_rate_sql("node_disk_written_bytes_total", device + " || ' written'", host_filter),
        **timeseries("Bps"),
    )
    return board
