"""The Fleet dashboard: every GPU of a project at a glance, from the store."""

from __future__ import annotations

from dashboards.board import PROJECT_VARIABLE, Board, query_variable
from dashboards.panel_sql import GPU_FILTER, GPU_NAME, counter_rate_sql, gauge_sql

HOST_FILTER = "labels->>'Hostname' IN (${host:sqlstring})"
DEVICE = "(labels->>'Hostname') || ' ' || (labels->>'device')"


def fleet() -> Board:
    gpu_series = (
        "SELECT DISTINCT labels->>'gpu' FROM series AS s JOIN projects AS p "
        "ON p.id = s.project_id WHERE p.name = ${project:sqlstring} "
        "AND s.metric = 'DCGM_FI_DEV_FB_USED' AND labels->>'Hostname' IN (${host:sqlstring}) "
        "ORDER BY 1"
    )
    host_series = (
        "SELECT DISTINCT labels->>'Hostname' FROM series AS s JOIN projects AS p "
        "ON p.id = s.project_id WHERE p.name = ${project:sqlstring} "
        "AND (s.metric = 'DCGM_FI_DEV_FB_USED' OR s.metric LIKE 'node%') ORDER BY 1"
    )
    board = Board(
        "tuneloop-fleet",
        "Fleet",
        "The GPU fleet at a glance: utilization, memory, power, temperature, clocks and "
        "errors per host and GPU (dcgm-exporter names), network and disk I/O per host.",
        variables=[
            PROJECT_VARIABLE,
            # Every GPU and MIG instance reports framebuffer memory; not all report utilization.
            query_variable("host", "Hostname", host_series, multi=True, refresh=2),
            query_variable("gpu", "GPU", gpu_series, multi=True, refresh=2),
        ],
    )
    gauges = (
        (
            "GPU utilization",
            "Share of time a kernel ran on the GPU (DCGM_FI_DEV_GPU_UTIL); MIG instances "
            "report none.",
            "DCGM_FI_DEV_GPU_UTIL",
            "avg",
            "percent",
        ),
        (
            "GPU memory used",
            "Framebuffer memory in use (DCGM_FI_DEV_FB_USED, MiB).",
            "DCGM_FI_DEV_FB_USED",
            "avg",
            "mbytes",
        ),
        (
            "Power draw",
            "Board power draw (DCGM_FI_DEV_POWER_USAGE).",
            "DCGM_FI_DEV_POWER_USAGE",
            "avg",
            "watt",
        ),
        (
            "GPU temperature (max)",
            "Hottest GPU temperature reading per interval (DCGM_FI_DEV_GPU_TEMP).",
            "DCGM_FI_DEV_GPU_TEMP",
            "max",
            "celsius",
        ),
        (
            "SM clock (min; a drop under load is throttling)",
            "Lowest streaming-multiprocessor clock per interval (DCGM_FI_DEV_SM_CLOCK, MHz, "
            "shown in Hz); see the clock event reasons for why it dropped.",
            "DCGM_FI_DEV_SM_CLOCK",
            "min * 1000000",
            "hertz",
        ),
        (
            "Clock event reasons (bitmask, max)",
            "Why the clocks are held back (DCGM_FI_DEV_CLOCKS_EVENT_REASONS bitmask: power "
            "cap, thermal slowdown, ...); 0 is none.",
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "max",
            "none",
        ),
        (
            "Last XID error code",
            "The last XID error the driver reported for the GPU (DCGM_FI_DEV_XID_ERRORS); "
            "0 is none.",
            "DCGM_FI_DEV_XID_ERRORS",
            "max",
            "none",
        ),
    )
    for title, description, metric, value, unit in gauges:
        board.add(
            "timeseries",
            title,
            description,
            gauge_sql(metric, GPU_NAME, GPU_FILTER, value),
            unit=unit,
        )
    board.add(
        "timeseries",
        "Remapped rows and PCIe replays",
        "Memory rows remapped after uncorrectable errors (a cumulative count: any is worth a "
        "look) and PCIe replays per second (retries of the link).",
        gauge_sql(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            GPU_NAME + " || ' remapped'",
            GPU_FILTER,
            "max",
        ),
        counter_rate_sql(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU_NAME + " || ' replays'", GPU_FILTER
        ),
        unit="none",
    )
    board.add(
        "timeseries",
        "Network I/O per host and interface",
        "Bytes per second received and sent per network interface (node-exporter counters, "
        "as rates).",
        counter_rate_sql("node_network_receive_bytes_total", DEVICE + " || ' rx'", HOST_FILTER),
        counter_rate_sql("node_network_transmit_bytes_total", DEVICE + " || ' tx'", HOST_FILTER),
        unit="Bps",
    )
    board.add(
        "timeseries",
        "Disk I/O per host and device",
        "Bytes per second read and written per disk (node-exporter counters, as rates).",
        counter_rate_sql("node_disk_read_bytes_total", DEVICE + " || ' read'", HOST_FILTER),
        counter_rate_sql("node_disk_written_bytes_total", DEVICE + " || ' written'", HOST_FILTER),
        unit="Bps",
    )
    return board
