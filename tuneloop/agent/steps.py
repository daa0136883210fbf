"""Step instrumentation: one ``tuneloop.step`` span per training step with
``tuneloop.phase.<phase>`` children, as ``docs/step-timing.md`` specifies, exported over
OTLP/HTTP; and the gradient noise scale as a gauge.

``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http`` come with the agent.
Spans are created with explicit parents rather than through the current context, and exported
in batches off the training thread, so a step costs a few tens of microseconds.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextlib import nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any

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
"""The phases tuneloop's views and tuner know; a job may add its own names."""


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
    ) -> None:
        """Exports to ``url`` (the API's base URL) with ``token``, or to the given
        ``span_processor``/``metric_reader`` (tests, or an exporter of one's own).
        ``phase_every``: time phases only on steps whose number is a multiple of it (every
        step still gets its step span); tuneloop aggregates phases over time anyway."""
        if phase_every < 1:
            raise ValueError(f"phase_every must be >= 1, got {phase_every}")
        self.phase_every = phase_every
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
        self._meters.get_meter("tuneloop.agent").create_observable_gauge(
            "tuneloop.gradient_noise_scale",
            callbacks=[self._observe_noise_scale],
            description="Gradient noise scale B_simple, in samples",
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

    def _observe_noise_scale(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self._noise_scale is not None:
            yield Observation(self._noise_scale)

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
