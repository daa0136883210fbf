"""Metrics tuneloop's collectors write, so a rule may name one before its first sample arrives.

Every DCGM field of dcgm-exporter's counter list (also the ones it leaves commented out, which a
user's own list may enable), the host source's node-exporter counters, the step timings the
OTLP receiver stores and the series the job diagnosis writes from them, and the
request-duration histogram of inference servers. Anything else is known once the project has a
series of that name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

from tuneloop.step_timing import AGENT_GAUGES, DIAGNOSIS_SERIES, STEP_TIMING_SERIES
from tuneloop.storage.timeseries.types import SeriesKind

_COUNTERS_PACKAGE = "collector.sources"
_COUNTERS_RESOURCE = "data/dcgm-default-counters.csv"
_CSV_ROW = re.compile(r"^#?\s*(DCGM_[A-Z0-9_]+)\s*,\s*(gauge|counter)\s*,", re.MULTILINE)

# Fields dcgm-exporter can export that are not in its counter list at all.
_EXTRA_DCGM: Mapping[str, SeriesKind] = {
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": SeriesKind.GAUGE,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": SeriesKind.GAUGE,
}

_HOST: Mapping[str, SeriesKind] = {
    name: SeriesKind.COUNTER
    for name in (
        "node_network_receive_bytes_total",
        "node_network_transmit_bytes_total",
        "node_network_receive_packets_total",
        "node_network_transmit_packets_total",
        "node_network_receive_errs_total",
        "node_network_transmit_errs_total",
        "node_network_receive_drop_total",
        "node_network_transmit_drop_total",
        "node_disk_read_bytes_total",
        "node_disk_written_bytes_total",
        "node_disk_reads_completed_total",
        "node_disk_writes_completed_total",
        "node_cpu_seconds_total",
        "node_infiniband_port_data_received_bytes_total",
        "node_infiniband_port_data_transmitted_bytes_total",
    )
}

_STEP_TIMING: Mapping[str, SeriesKind] = {
    name: SeriesKind.GAUGE for name in (*STEP_TIMING_SERIES, *AGENT_GAUGES, *DIAGNOSIS_SERIES)
}


# Histograms inference servers export over OTLP (semantic conventions), stored as classic
# ``_bucket`` counters.
_INFERENCE: Mapping[str, SeriesKind] = {
    "http_server_request_duration_seconds_bucket": SeriesKind.COUNTER,
    "http_server_request_duration_seconds_count": SeriesKind.COUNTER,
    "http_server_request_duration_seconds_sum": SeriesKind.COUNTER,
}


@cache
def known_metrics() -> Mapping[str, SeriesKind]:
    text = resources.files(_COUNTERS_PACKAGE).joinpath(_COUNTERS_RESOURCE).read_text()
    dcgm = {name: SeriesKind(kind) for name, kind in _CSV_ROW.findall(text)}
    return {**dcgm, **_EXTRA_DCGM, **_HOST, **_STEP_TIMING, **_INFERENCE}
