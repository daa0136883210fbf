"""Step instrumentation: one ``tuneloop.step`` span per training step with
``tuneloop.phase.<phase>`` children, as ``docs/step-timing.md`` specifies, exported over
OTLP/HTTP; and, as metrics, the gradient noise scale, the gradient norm and learning rate of the
latest step, the job's FLOPs per sample (and its GPUs' peak, when declared) as gauges, and
checkpoint save times as a histogram.

``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http`` come with the agent.
Spans are created with explicit parents rather than through the current context, and exported
in batches off the training thread, so a step costs a few tens of microseconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any, SupportsFloat

import requests
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode, set_span_in_context

from tuneloop.agent.refusals import TOKEN_REFUSALS

if TYPE_CHECKING:
    from collections.abc import Iterable

PHASES = ("data_loading", "forward", "backward", "grad_sync", "optimizer")
"""The phases tuneloop's views and tuner know; a job may add its own names. ``data_loading``
is the data-loader wait: the time a step waits for its next batch."""

CHECKPOINT_BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0)
"""Histogram bounds of checkpoint save times: from a small model's local save to a large
model's sharded write to remote storage."""


def _positive(name: str, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return value


def _watched_session(what: str) -> requests.Session:
    """An HTTP session for an exporter that reports a refused token (once, clearly)."""

    def note(response: requests.Response, *_args: Any, **_kwargs: Any) -> None:
        TOKEN_REFUSALS.saw(response.status_code, response.text, what)

    session = requests.Session()
    session.hooks["response"].append(note)
    return session


PHASE_PREFIX = "tuneloop.phase."


class WholeSteps(SpanProcessor):
    """Hands a step's phase spans to ``inner`` only when their step span ends, together with
    it: a batch processor exporting on a timer would otherwise split a long step's spans across
    two requests, and its early phases would be stored as separate samples of the step's phase
    time (docs/step-timing.md)."""

    def __init__(self, inner: SpanProcessor) -> None:
        self._inner = inner
        self._held: dict[int, list[ReadableSpan]] = {}
        self._lock = threading.Lock()

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        self._inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        parent = span.parent
        if span.name.startswith(PHASE_PREFIX) and parent is not None:
            with self._lock:
                self._held.setdefault(parent.span_id, []).append(span)
            return
        held: list[ReadableSpan] = []
        if span.context is not None:
            with self._lock:
                held = self._held.pop(span.context.span_id, [])
        for phase in held:
            self._inner.on_end(phase)
        self._inner.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        with self._lock:
            orphans = [span for spans in self._held.values() for span in spans]
            self._held.clear()
        for span in orphans:  # phases whose step never ended: still time spent
            self._inner.on_end(span)
        self._inner.shutdown()


class StepTracer:
    """Creates the step and phase spans of one process (one rank) of a job."""

    def __init__(
        self,
        url: str | None,
        token: str | None,
        job: str,
        *,
        rank: int = 0,
        resource: Mapping[str, Any] | None = None,
        span_processor: SpanProcessor | None = None,
        metric_reader: MetricReader | None = None,
        export_interval_s: float = 1.0,
        phase_every: int = 1,
        flops_per_sample: float | None = None,
        peak_flops_per_gpu: float | None = None,
    ) -> None:
        """Exports to ``url`` (the API's base URL) with ``token``, or to the given
        ``span_processor``/``metric_reader`` (tests, or an exporter of one's own).
        ``phase_every``: time phases only on steps whose number is a multiple of it (every
        step still gets its step span); tuneloop aggregates phases over time anyway.
        ``flops_per_sample``: floating-point operations of one sample's forward and backward
        pass (docs/agent.md shows how to count them), for the diagnosis's MFU;
        ``peak_flops_per_gpu``: the peak FLOP/s of one of the job's GPUs, when the table of
        known GPUs does not hold it."""
        if phase_every < 1:
            raise ValueError(f"phase_every must be >= 1, got {phase_every}")
        self.phase_every = phase_every
        self.flops_per_sample = _positive("flops_per_sample", flops_per_sample)
        self.peak_flops_per_gpu = _positive("peak_flops_per_gpu", peak_flops_per_gpu)
        attributes: dict[str, Any] = {
            "service.name": job,
            "tuneloop.job": job,
            "tuneloop.rank": rank,
        }
        attributes.update(resource or {})
        self.resource = Resource.create(attributes)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if span_processor is None:
            if url is None:
                raise ValueError("give url (and token) or a span_processor")
            span_processor = BatchSpanProcessor(
                OTLPSpanExporter(
                    endpoint=f"{url.rstrip('/')}/v1/traces",
                    headers=headers,
                    compression=Compression.Gzip,
                    session=_watched_session("step timings"),
                ),
                schedule_delay_millis=int(export_interval_s * 1000),
            )
        if metric_reader is None and url is not None:
            metric_reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(
                    endpoint=f"{url.rstrip('/')}/v1/metrics",
                    headers=headers,
                    compression=Compression.Gzip,
                    session=_watched_session("metrics export"),
                ),
                export_interval_millis=max(1000, int(export_interval_s * 1000)),
            )
        self._provider = TracerProvider(resource=self.resource)
        self._provider.add_span_processor(WholeSteps(span_processor))
        self._tracer = self._provider.get_tracer("tuneloop.agent")
        self._meters = MeterProvider(
            resource=self.resource, metric_readers=[metric_reader] if metric_reader else []
        )
        self._noise_scale: float | None = None
        self._grad_norm: SupportsFloat | None = None
        self._learning_rate: SupportsFloat | None = None
        meter = self._meters.get_meter("tuneloop.agent")
        # The names map to tuneloop.step_timing's series (dots to underscores, unit suffixes);
        # a point's ``rank`` labels the series as the receiver labels the step timings.
        self._point = {"rank": str(rank)}
        gauges: dict[str, tuple[Callable[[], SupportsFloat | None], str]] = {
            "tuneloop.gradient_noise_scale": (
                lambda: self._noise_scale,
                "Gradient noise scale B_simple, in samples",
            ),
            "tuneloop.grad_norm": (lambda: self._grad_norm, "Global L2 norm of the gradient"),
            "tuneloop.learning_rate": (lambda: self._learning_rate, "The optimizer's rate"),
            "tuneloop.flops_per_sample": (
                lambda: self.flops_per_sample,
                "FLOPs of one sample's forward and backward pass",
            ),
            "tuneloop.peak_flops_per_gpu": (
                lambda: self.peak_flops_per_gpu,
                "Declared peak FLOP/s of one GPU",
            ),
        }
        for name, (read, description) in gauges.items():
            meter.create_observable_gauge(
                name, callbacks=[_latest(read, self._point)], description=description
            )
        self._checkpoints = meter.create_histogram(
            "tuneloop.checkpoint.duration",
            unit="s",
            description="Time to save a checkpoint",
            explicit_bucket_boundaries_advisory=list(CHECKPOINT_BUCKETS_S),
        )
        self._phase_names = {name: f"{PHASE_PREFIX}{name}" for name in PHASES}

    def step(
        self,
        number: int | None = None,
        *,
        samples: float | None = None,
        tokens: float | None = None,
    ) -> StepSpan:
        """A context manager timing one step; set ``samples`` (all micro-batches together)
        here or on the returned object before it ends."""
        return StepSpan(self, number, samples, tokens)

    def set_noise_scale(self, value: float | None) -> None:
        """The latest estimate, exported with the metrics (``tuneloop_gradient_noise_scale``)."""
        self._noise_scale = value

    def record(
        self,
        *,
        grad_norm: SupportsFloat | None = None,
        learning_rate: SupportsFloat | None = None,
    ) -> None:
        """The latest step's gradient norm and learning rate, exported as gauges. A tensor is
        kept as is and read once per export, off the training thread, so reporting a CUDA
        tensor here never waits for the GPU."""
        if grad_norm is not None:
            self._grad_norm = grad_norm
        if learning_rate is not None:
            self._learning_rate = learning_rate

    def record_checkpoint(self, seconds: float) -> None:
        """One checkpoint save that took ``seconds``."""
        if math.isfinite(seconds) and seconds >= 0:
            self._checkpoints.record(seconds, self._point)

    @contextmanager
    def checkpoint(self) -> Iterator[None]:
        """Times a checkpoint save (one that raises is not recorded)."""
        start = time.perf_counter()
        yield
        self.record_checkpoint(time.perf_counter() - start)

    def flush(self, timeout_s: float = 10.0) -> None:
        self._provider.force_flush(int(timeout_s * 1000))
        self._meters.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is left and stop the exporters."""
        self._provider.shutdown()
        self._meters.shutdown()


class StepSpan:
    """One ``tuneloop.step`` span; :meth:`phase` times a phase inside it."""

    __slots__ = ("_context", "_span", "_tracer", "number", "samples", "tokens")

    def __init__(
        self, tracer: StepTracer, number: int | None, samples: float | None, tokens: float | None
    ) -> None:
        self._tracer = tracer
        self.number = number
        self.samples = samples
        self.tokens = tokens
        self._span: Span | None = None
        self._context: Context | None = None

    def __enter__(self) -> StepSpan:
        self._span = self._tracer._tracer.start_span("tuneloop.step")
        self._context = set_span_in_context(self._span)
        return self

    def phase(self, name: str) -> PhaseSpan | nullcontext[None]:
        every = self._tracer.phase_every
        if every > 1 and (self.number is None or self.number % every):
            return _NO_PHASE
        span_name = self._tracer._phase_names.get(name) or f"{PHASE_PREFIX}{name}"
        return PhaseSpan(self._tracer, span_name, self._context)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        span = self._span
        assert span is not None, "StepSpan used outside its with block"
        if self.number is not None:
            span.set_attribute("tuneloop.step", self.number)
        if self.samples is not None:
            span.set_attribute("tuneloop.samples", self.samples)
        if self.tokens is not None:
            span.set_attribute("tuneloop.tokens", self.tokens)
        if exc is not None:
            span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))  # not timed, by contract
        span.end()


_NO_PHASE: nullcontext[None] = nullcontext()


def _latest(
    read: Callable[[], SupportsFloat | None], point: Mapping[str, str]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """An observable gauge's callback: the value ``read()`` holds now, if any."""

    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        value = read()
        if value is not None:
            yield Observation(float(value), point)

    return observe


class PhaseSpan:
    __slots__ = ("_context", "_name", "_span", "_tracer")

    def __init__(self, tracer: StepTracer, name: str, context: Context | None) -> None:
        self._tracer = tracer
        self._name = name
        self._context = context
        self._span: Span | None = None

    def __enter__(self) -> PhaseSpan:
        self._span = self._tracer._tracer.start_span(self._name, context=self._context)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._span is not None
        self._span.end()
