"""OpenTelemetry -> Prometheus metric names (the translator's rules, table-driven)."""

from __future__ import annotations

import pytest

from collector.otlp.names import NameKind, escape_legacy, metric_name

COUNTER, GAUGE, OTHER = NameKind.COUNTER, NameKind.GAUGE, NameKind.OTHER


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        ("http.server.request.duration", "s", OTHER, "http_server_request_duration_seconds"),
        ("gpu.memory.used", "By", GAUGE, "gpu_memory_used_bytes"),
        ("gpu.memory.used", "MiBy", GAUGE, "gpu_memory_used_mebibytes"),
        ("train.requests", "{request}", COUNTER, "train_requests_total"),
        ("train.requests", "", COUNTER, "train_requests_total"),
        ("requests_total", "", COUNTER, "requests_total"),
        ("total.requests", "", COUNTER, "requests_total"),
        ("io.bytes", "By", COUNTER, "io_bytes_total"),  # unit already a word: not repeated
        ("latency_seconds", "s", OTHER, "latency_seconds"),
        ("step.time", "ms", OTHER, "step_time_milliseconds"),  # never converted
        ("net.throughput", "By/s", GAUGE, "net_throughput_bytes_per_second"),
        ("tokens", "{token}/s", GAUGE, "tokens_per_second"),
        ("gpu.utilization", "1", GAUGE, "gpu_utilization_ratio"),
        ("gpu.utilization.ratio", "1", GAUGE, "gpu_utilization_ratio"),
        ("events", "1", COUNTER, "events_total"),  # unit 1 adds nothing to counters
        ("temperature", "Cel", GAUGE, "temperature_celsius"),
        ("weird", "furlongs", GAUGE, "weird_furlongs"),  # unknown units are kept
        ("a..b__c--d", "", GAUGE, "a_b_c_d"),
        ("2xx.responses", "", COUNTER, "_2xx_responses_total"),
        ("GPU.Power", "W", GAUGE, "GPU_Power_watts"),
        ("...", "s", GAUGE, ""),
        ("ünïcödé", "", GAUGE, "ünïcödé"),  # letters of any script are kept (UTF-8 names)
        ("ünïcödé.temp", "Cel", GAUGE, "ünïcödé_temp_celsius"),
        ("u\u0308ber", "", GAUGE, "über"),  # NFC: a combining accent is not a word break
        ("温度.gpu", "", GAUGE, "温度_gpu"),
        ("", "", COUNTER, ""),
    ],
)
def test_metric_name(name: str, unit: str, kind: NameKind, expected: str) -> None:
    assert metric_name(name, unit, kind) == expected


@pytest.mark.parametrize(
    ("name", "escaped"),
    [
        ("gpu_temp", "gpu_temp"),
        ("ünïcödé", "U___fc_n_ef_c_f6_d_e9_"),
        ("a_ü", "U__a___fc_"),
        ("1ü", "U___31__fc_"),
    ],
)
def test_escape_legacy(name: str, escaped: str) -> None:
    assert escape_legacy(name) == escaped
