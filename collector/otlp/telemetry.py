"""The receiver's own Prometheus metrics, on the registry of the app that serves it."""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry, Counter

from collector.otlp.common import Rejections


class OtlpTelemetry:
    """``tuneloop_otlp_requests_total{signal,encoding,code}``,
    ``tuneloop_otlp_points_received_total{signal}`` and
    ``tuneloop_otlp_points_rejected_total{signal,reason}`` (for traces, points are spans)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "tuneloop_otlp_requests",
            "OTLP/HTTP export requests, by signal, body encoding and HTTP status code.",
            ["signal", "encoding", "code"],
            registry=registry,
        )
        self.received = Counter(
            "tuneloop_otlp_points_received",
            "Data points (metrics) or spans (traces) received in accepted requests.",
            ["signal"],
            registry=registry,
        )
        self.rejected = Counter(
            "tuneloop_otlp_points_rejected",
            "Data points or spans rejected from accepted requests, by reason.",
            ["signal", "reason"],
            registry=registry,
        )

    def request(self, signal: str, encoding: str, code: int) -> None:
        self.requests.labels(signal=signal, encoding=encoding, code=str(code)).inc()

    def points(self, signal: str, received: int, rejections: Rejections) -> None:
        self.received.labels(signal=signal).inc(received)
        for reason, count in rejections.counts.items():
            self.rejected.labels(signal=signal, reason=reason).inc(count)


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, OtlpTelemetry] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def telemetry_for(registry: CollectorRegistry) -> OtlpTelemetry:
    """The one :class:`OtlpTelemetry` of ``registry`` (a metric name registers only once)."""
    with _LOCK:
        telemetry = _BY_REGISTRY.get(registry)
        if telemetry is None:
            telemetry = _BY_REGISTRY[registry] = OtlpTelemetry(registry)
        return telemetry
