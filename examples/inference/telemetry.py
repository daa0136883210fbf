"""What a replica reports over OTLP/HTTP beside the agent's step timings: its request latency
histogram, a counter of the requests arriving (answered or not) and its queue depth, under the
job's name (``service.name``) and the replica's (``service.instance.id``, stored as
``instance``).

tuneloop's receiver names them as Prometheus does: ``tuneloop_request_duration_seconds``
(``_bucket``/``_sum``/``_count``; the P99 of the ``slo_throughput`` and ``offered_load_p99``
objectives, and the served rate), ``inference_requests_arrived_total`` (the offered rate of
``offered_load_p99`` and its load bands) and ``inference_queue_depth`` (the autoscaler's queue
signal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

LATENCY_BUCKETS_S: Final = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0,
)  # fmt: skip
"""Bounds around the SLOs a small model's service meets: 20 ms to 1 s."""
LATENCY_METRIC: Final = "tuneloop.request.duration"
QUEUE_METRIC: Final = "inference.queue.depth"
ARRIVED_METRIC: Final = "inference.requests.arrived"


class ServerTelemetry:
    """``record(seconds)`` once per answered request; the queue depth is read at each export
    from the function :meth:`watch_queue` gave (none until then)."""

    def __init__(
        self,
        *,
        job: str,
        replica: str,
        variant: str,
        url: str | None = None,
        token: str | None = None,
        reader: MetricReader | None = None,
        export_interval_s: float = 1.0,
    ) -> None:
        if reader is None:
            if url is None:
                raise ValueError("give url (and token) or a metric reader")
            reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(
                    endpoint=f"{url.rstrip('/')}/v1/metrics",
                    headers={"Authorization": f"Bearer {token}"} if token else {},
                    compression=Compression.Gzip,
                ),
                export_interval_millis=int(export_interval_s * 1000),
            )
        resource = Resource.create({"service.name": job, "service.instance.id": replica})
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = self._provider.get_meter("examples.inference")
        self._point = {"variant": variant}
        self._latency = meter.create_histogram(
            LATENCY_METRIC,
            unit="s",
            description="Time from a request's arrival to its answer",
            explicit_bucket_boundaries_advisory=list(LATENCY_BUCKETS_S),
        )
        self._arrived = meter.create_counter(
            ARRIVED_METRIC, unit="{request}", description="Requests arriving, before the queue"
        )
        self._queue_depth: Callable[[], int] | None = None

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if self._queue_depth is not None:
                yield Observation(self._queue_depth(), self._point)

        meter.create_observable_gauge(
            QUEUE_METRIC, callbacks=[observe], description="Requests waiting for a batch"
        )

    def watch_queue(self, queue_depth: Callable[[], int]) -> None:
        self._queue_depth = queue_depth

    def arrived(self) -> None:
        """Once per request as it arrives, whether it is then answered or refused."""
        self._arrived.add(1, self._point)

    def record(self, seconds: float) -> None:
        self._latency.record(seconds, self._point)

    def shutdown(self) -> None:
        self._provider.shutdown()
