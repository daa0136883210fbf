"""The Fleet dashboard in PromQL, for a Prometheus that scrapes dcgm-exporter and node-exporter
(or tuneloop's project view): what NVIDIA's dcgm-exporter dashboard shows, MIG instances
included, filtered by ``job``, ``instance``, ``Hostname`` and ``gpu``."""

from __future__ import annotations

from dashboards.board import PROMETHEUS, Board, promql_variable

# Every GPU and every MIG instance reports framebuffer memory (not all report utilization);
# node-exporter hosts report network counters.
GPU_METRIC = "DCGM_FI_DEV_FB_USED"
ANY_TARGET = '__name__=~"DCGM_FI_DEV_FB_USED|node_network_receive_bytes_total"'
TARGET = 'job=~"$job", instance=~"$instance"'
GPU = f'{TARGET}, Hostname=~"$Hostname", gpu=~"$gpu"'
# node-exporter has no Hostname label: its series pass the Hostname filter, narrowed by
# instance; host series that carry Hostname (tuneloop's own collector) are filtered by it.
HOST = f'{TARGET}, Hostname=~"$Hostname|"'
LEGEND = "{{Hostname}} gpu {{gpu}} {{GPU_I_PROFILE}} {{GPU_I_ID}}"
"""A MIG instance (``GPU_I_PROFILE``, ``GPU_I_ID``) is a series of its own."""
DEVICE = "{{Hostname}} {{instance}} {{device}}"


def fleet_prometheus() -> Board:
    board = Board(
        "tuneloop-fleet-prometheus",
        "Fleet (Prometheus)",
        "The Fleet dashboard in PromQL, for a Prometheus that scrapes dcgm-exporter and "
        "node-exporter, or tuneloop's project view (/api/v1/projects/NAME/metrics): "
        "utilization, tensor cores, framebuffer, power, temperature, clocks, energy and errors "
        "per GPU and MIG instance, network and disk I/O per host.",
        plugin=PROMETHEUS,
        variables=[
            promql_variable("job", "Job", f"label_values({{{ANY_TARGET}}}, job)", all_value=".+"),
            promql_variable(
                "instance",
                "Instance",
                f'label_values({{{ANY_TARGET}, job=~"$job"}}, instance)',
                all_value=".+",
            ),
            promql_variable(
                "Hostname", "Hostname", f"label_values({GPU_METRIC}{{{TARGET}}}, Hostname)"
            ),
            promql_variable(
                "gpu", "GPU", f'label_values({GPU_METRIC}{{{TARGET}, Hostname=~"$Hostname"}}, gpu)'
            ),
        ],
    )
    gpu_panels = (
        (
            "GPU utilization",
            "Share of time a kernel ran on the GPU (DCGM_FI_DEV_GPU_UTIL). MIG instances "
            "report none: see tensor core utilization.",
            f"DCGM_FI_DEV_GPU_UTIL{{{GPU}}}",
            "percent",
        ),
        (
            "Tensor core utilization",
            "Share of cycles the tensor (HMMA) pipes were busy (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE), "
            "per GPU and per MIG instance.",
            f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{GPU}}}",
            "percentunit",
        ),
        (
            "Framebuffer memory used",
            "Framebuffer memory in use (DCGM_FI_DEV_FB_USED, MiB), per GPU and MIG instance.",
            f"DCGM_FI_DEV_FB_USED{{{GPU}}}",
            "mbytes",
        ),
        (
            "Framebuffer memory free",
            "Framebuffer memory free (DCGM_FI_DEV_FB_FREE, MiB), per GPU and MIG instance.",
            f"DCGM_FI_DEV_FB_FREE{{{GPU}}}",
            "mbytes",
        ),
        (
            "Power draw",
            "Board power draw (DCGM_FI_DEV_POWER_USAGE).",
            f"DCGM_FI_DEV_POWER_USAGE{{{GPU}}}",
            "watt",
        ),
        (
            "GPU temperature",
            "GPU temperature (DCGM_FI_DEV_GPU_TEMP).",
            f"DCGM_FI_DEV_GPU_TEMP{{{GPU}}}",
            "celsius",
        ),
        (
            "SM clock (a drop under load is throttling)",
            "Streaming-multiprocessor clock (DCGM_FI_DEV_SM_CLOCK, reported in MHz).",
            f"DCGM_FI_DEV_SM_CLOCK{{{GPU}}} * 1000000",
            "hertz",
        ),
        (
            "Energy use (from the energy counter)",
            "Average power over the rate interval from the energy counter "
            "(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ): catches what the power samples miss.",
            f"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{GPU}}}[$__rate_interval]) / 1000",
            "watt",
        ),
        (
            "Last XID error code",
            "The last XID error the driver reported (DCGM_FI_DEV_XID_ERRORS); 0 is none.",
            f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}",
            "none",
        ),
    )
    for title, description, expr, unit in gpu_panels:
        board.add_promql(title, description, (expr, LEGEND), unit=unit)
    board.add_promql(
        "Remapped rows and PCIe replays",
        "Memory rows remapped after uncorrectable errors (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, "
        "a cumulative count: any is worth a look) and PCIe replays per second "
        "(DCGM_FI_DEV_PCIE_REPLAY_COUNTER, retries of the link).",
        (f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{GPU}}}", LEGEND + " remapped"),
        (f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{GPU}}}[$__rate_interval])", LEGEND + " replays"),
        unit="none",
    )
    board.add_promql(
        "Total power draw",
        "Power drawn by the selected GPUs together (each physical GPU once, however many MIG "
        "instances it has).",
        (f"sum(max by (Hostname, UUID) (DCGM_FI_DEV_POWER_USAGE{{{GPU}}}))", "total"),
        unit="watt",
        kind="stat",
        width=6,
    )
    board.add_promql(
        "Average GPU temperature",
        "Mean temperature of the selected GPUs (each physical GPU once).",
        (f"avg(max by (Hostname, UUID) (DCGM_FI_DEV_GPU_TEMP{{{GPU}}}))", "average"),
        unit="celsius",
        kind="stat",
        width=6,
    )
    board.add_promql(
        "MIG instances",
        "GPU instances of GPUs in MIG mode (GPU_I_PROFILE, GPU_I_ID) and their framebuffer "
        "memory in use.",
        (f'DCGM_FI_DEV_FB_USED{{{GPU}, GPU_I_PROFILE!=""}}', LEGEND),
        unit="mbytes",
        kind="table",
    )
    board.add_promql(
        "Network I/O per host and interface",
        "Bytes per second received and sent per network interface (node-exporter counters).",
        (f"rate(node_network_receive_bytes_total{{{HOST}}}[$__rate_interval])", DEVICE + " rx"),
        (f"rate(node_network_transmit_bytes_total{{{HOST}}}[$__rate_interval])", DEVICE + " tx"),
        unit="Bps",
    )
    board.add_promql(
        "Disk I/O per host and device",
        "Bytes per second read and written per disk (node-exporter counters).",
        (f"rate(node_disk_read_bytes_total{{{HOST}}}[$__rate_interval])", DEVICE + " read"),
        (f"rate(node_disk_written_bytes_total{{{HOST}}}[$__rate_interval])", DEVICE + " written"),
        unit="Bps",
    )
    return board
