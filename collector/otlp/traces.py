"""ExportTraceServiceRequest -> step-timing series. The conventions are the contract in
``docs/step-timing.md``; in short:

* a span named ``tuneloop.step`` is one training step; its attributes ``tuneloop.job``,
  ``tuneloop.rank``, ``tuneloop.step``, ``tuneloop.samples`` and ``tuneloop.tokens`` (job and
  rank may instead be resource attributes; ``service.name`` is the fallback job, ``0`` the
  default rank);
* a descendant span named ``tuneloop.phase.<phase>`` is time spent in one phase of its step
  (``data_loading``, ``forward``, ``backward``, ``grad_sync``, ``optimizer``, or a custom
  ``[a-z][a-z0-9_]{0,31}``); spans of the same phase under one step are summed.

Series written, each labelled ``job`` and ``rank``, stamped at the step's (or phase's) end:
``tuneloop_step_duration_seconds``, ``tuneloop_step_phase_seconds{phase}``,
``tuneloop_samples_per_second``, ``tuneloop_tokens_per_second`` and ``tuneloop_step_number``.

Every other span is accepted and ignored (tuneloop stores no traces). A ``tuneloop.*`` span that
breaks the conventions is rejected with a reason. A step or phase span with status ERROR is
accepted and not timed, and so are the phases of a failed step: a step that raised says
nothing about how long a step takes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from collector.otlp.common import Rejected, Rejections, Sample, SeriesBuilder, to_datetime
from collector.otlp.labels import check_labels, stringify
from tuneloop.step_timing import (
    PHASE_DURATION,
    SAMPLES_PER_SECOND,
    STEP_DURATION,
    STEP_NUMBER,
    TOKENS_PER_SECOND,
)
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind

STEP_SPAN: Final = "tuneloop.step"
PHASE_PREFIX: Final = "tuneloop.phase."
PHASES: Final = ("data_loading", "forward", "backward", "grad_sync", "optimizer")
"""The phases every tuneloop view knows; a job may add its own (``PHASE_RE``)."""
PHASE_RE: Final = re.compile(r"[a-z][a-z0-9_]{0,31}")

JOB_ATTR: Final = "tuneloop.job"
RANK_ATTR: Final = "tuneloop.rank"
STEP_ATTR: Final = "tuneloop.step"
SAMPLES_ATTR: Final = "tuneloop.samples"
TOKENS_ATTR: Final = "tuneloop.tokens"

_UNKNOWN_SERVICE: Final = "unknown_service"
"""The SDK's ``service.name`` when none was configured: not a job name."""
_NANOS: Final = 1e9
_MAX_DEPTH: Final = 16
"""Ancestors searched for a phase span's step (bounds the walk if parent links loop)."""


@dataclass(slots=True)
class MappedSpans:
    batches: list[SeriesBatch]
    spans: int
    rejections: Rejections = field(default_factory=Rejections)

    @property
    def accepted(self) -> int:
        return self.spans - self.rejections.total


@dataclass(frozen=True, slots=True)
class _Identity:
    """Who a span times: its job and rank labels."""

    job: str
    rank: str

    @property
    def labels(self) -> dict[str, str]:
        return {"job": self.job, "rank": self.rank}


@dataclass(frozen=True, slots=True)
class _Step:
    identity: _Identity
    end: datetime
    failed: bool


@dataclass(slots=True)
class _PhaseGroup:
    identity: _Identity
    phase: str
    nanos: int = 0
    end: datetime | None = None
    spans: int = 0


def map_spans(request: ExportTraceServiceRequest, *, now: datetime, max_series: int) -> MappedSpans:
    """The step-timing batches of ``request`` and the ``tuneloop.*`` spans rejected, by why."""
    builder = SeriesBuilder(max_series)
    rejections = Rejections()
    spans = 0
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        all_spans = [s for scope in resource_spans.scope_spans for s in scope.spans]
        spans += len(all_spans)
        steps: dict[tuple[bytes, bytes], _Step] = {}
        for span in all_spans:
            if span.name == STEP_SPAN:
                _step(span, resource, now, builder, rejections, steps)
        parents = {(s.trace_id, s.span_id): s.parent_span_id for s in all_spans}
        groups: dict[tuple[bytes, bytes, str, _Identity], _PhaseGroup] = {}
        for span in all_spans:
            if span.name != STEP_SPAN and span.name.startswith("tuneloop."):
                step_id = _step_of(span, parents, steps)
                _phase(span, step_id, resource, now, rejections, steps, groups)
        for group in groups.values():
            _emit_phase(group, builder, rejections)
    return MappedSpans(builder.batches(), spans, rejections)


def _step(
    span: Span,
    resource: Mapping[str, AnyValue],
    now: datetime,
    builder: SeriesBuilder,
    rejections: Rejections,
    steps: dict[tuple[bytes, bytes], _Step],
) -> None:
    try:
        attrs = _attributes(span.attributes)
        identity = _identity(attrs, resource, None)
        end = _end_time(span, now)
        failed = span.status.code == Status.STATUS_CODE_ERROR
        steps[(span.trace_id, span.span_id)] = _Step(identity, end, failed)
        if failed:
            return
        seconds = (span.end_time_unix_nano - span.start_time_unix_nano) / _NANOS
        labels = identity.labels
        samples = [Sample(STEP_DURATION, labels, SeriesKind.GAUGE, end, seconds)]
        step = _number(attrs, STEP_ATTR, integral=True)
        if step is not None:
            samples.append(Sample(STEP_NUMBER, labels, SeriesKind.GAUGE, end, step))
        for attr, metric in ((SAMPLES_ATTR, SAMPLES_PER_SECOND), (TOKENS_ATTR, TOKENS_PER_SECOND)):
            amount = _number(attrs, attr, integral=False)
            if amount is not None and seconds > 0:
                samples.append(Sample(metric, labels, SeriesKind.GAUGE, end, amount / seconds))
        builder.add_point(samples)
    except Rejected as exc:
        rejections.add(exc.reason, f"span {span.name!r}: {exc.message}")


def _step_of(
    span: Span,
    parents: Mapping[tuple[bytes, bytes], bytes],
    steps: Mapping[tuple[bytes, bytes], _Step],
) -> bytes:
    """The span id of the step span above ``span`` in this request (its parent, or a further
    ancestor: phases may sit under a per-micro-batch span); else its parent's id, so that
    phases of one step still group together when the step is in another request."""
    ancestor = span.parent_span_id
    for _ in range(_MAX_DEPTH):
        if (span.trace_id, ancestor) in steps or not ancestor:
            return ancestor
        next_up = parents.get((span.trace_id, ancestor))
        if next_up is None:
            break
        ancestor = next_up
    return span.parent_span_id


def _phase(
    span: Span,
    step_id: bytes,
    resource: Mapping[str, AnyValue],
    now: datetime,
    rejections: Rejections,
    steps: Mapping[tuple[bytes, bytes], _Step],
    groups: dict[tuple[bytes, bytes, str, _Identity], _PhaseGroup],
) -> None:
    try:
        phase = span.name.removeprefix(PHASE_PREFIX)
        if not span.name.startswith(PHASE_PREFIX):
            raise Rejected(
                "unknown_tuneloop_span",
                f"names under 'tuneloop.' are reserved: use {STEP_SPAN!r} or "
                f"'{PHASE_PREFIX}<phase>'",
            )
        if not PHASE_RE.fullmatch(phase):
            raise Rejected("invalid_phase", f"phase {phase[:64]!r} must match {PHASE_RE.pattern}")
        parent = steps.get((span.trace_id, step_id))
        inherited = parent.identity if parent else None
        identity = _identity(_attributes(span.attributes), resource, inherited)
        end = _end_time(span, now)
        if span.status.code == Status.STATUS_CODE_ERROR or (parent and parent.failed):
            return
    except Rejected as exc:
        rejections.add(exc.reason, f"span {span.name[:100]!r}: {exc.message}")
        return
    key = (span.trace_id, step_id, phase, identity)
    group = groups.setdefault(key, _PhaseGroup(identity, phase))
    group.nanos += span.end_time_unix_nano - span.start_time_unix_nano
    group.spans += 1
    # Stamped at the parent step's end when it is in this request, so that every phase of a
    # step shares the step's timestamp; else at the latest end among the group's spans.
    stamp = parent.end if parent else end
    group.end = stamp if group.end is None or parent else max(group.end, stamp)


def _emit_phase(group: _PhaseGroup, builder: SeriesBuilder, rejections: Rejections) -> None:
    assert group.end is not None
    labels = {**group.identity.labels, "phase": group.phase}
    sample = Sample(PHASE_DURATION, labels, SeriesKind.GAUGE, group.end, group.nanos / _NANOS)
    try:
        builder.add_point([sample])
    except Rejected as exc:
        rejections.add(exc.reason, f"phase {group.phase!r}: {exc.message}", group.spans)


def _attributes(items: Iterable[KeyValue]) -> dict[str, AnyValue]:
    return {item.key: item.value for item in items}


def _identity(
    attrs: Mapping[str, AnyValue], resource: Mapping[str, AnyValue], parent: _Identity | None
) -> _Identity:
    job = _text(attrs, JOB_ATTR) or (parent.job if parent else "") or _text(resource, JOB_ATTR)
    if not job:
        service = _text(resource, "service.name")
        job = "" if service.startswith(_UNKNOWN_SERVICE) else service
    if not job:
        raise Rejected(
            "missing_job",
            f"set the {JOB_ATTR!r} attribute on the span or the resource, or service.name",
        )
    rank = _text(attrs, RANK_ATTR) or (parent.rank if parent else "") or _text(resource, RANK_ATTR)
    identity = _Identity(job, rank or "0")
    check_labels(identity.labels)
    return identity


def _text(attrs: Mapping[str, AnyValue], key: str) -> str:
    value = attrs.get(key)
    return "" if value is None else stringify(value)


def _number(attrs: Mapping[str, AnyValue], key: str, *, integral: bool) -> float | None:
    """A non-negative number attribute, ``None`` when absent; anything else is rejected."""
    value = attrs.get(key)
    if value is None:
        return None
    kind = value.WhichOneof("value")
    number: float | None = None
    if kind == "int_value":
        number = float(value.int_value)
    elif kind == "double_value" and not integral:
        number = value.double_value
    if number is None or not 0 <= number < float("inf"):
        wanted = "a non-negative integer" if integral else "a finite non-negative number"
        raise Rejected("invalid_attribute", f"{key!r} must be {wanted}")
    return number


def _end_time(span: Span, now: datetime) -> datetime:
    """The span's end, after checking that both its times are sane."""
    if span.end_time_unix_nano < span.start_time_unix_nano:
        raise Rejected("invalid_span_time", "the span ends before it starts")
    to_datetime(span.start_time_unix_nano, now, "start_time_unix_nano")
    return to_datetime(span.end_time_unix_nano, now, "end_time_unix_nano")
