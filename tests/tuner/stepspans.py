"""Step timings written the way a training job sends them: OTLP step spans with their phase
spans, one export request per rank, mapped by the receiver (``collector.otlp.traces``) and
stored. Ranks step in lockstep, as data-parallel ranks do: a slow rank's compute makes the
others wait in ``grad_sync``."""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span
from sqlalchemy import Engine

from collector.otlp.traces import map_spans
from tests.otlp.builders import span, traces_request
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow

ORDER = ("data_loading", "forward", "backward", "grad_sync", "optimizer")
COMPUTE = ("forward", "backward")
NS = 1_000_000_000


def write_steps(
    engine: Engine, project_id: int, job: str, phases: Mapping[str, float], **how: Any
) -> None:
    """:func:`step_batches` (``how`` its options) stored in the store."""
    result = SampleWriter(engine).write(project_id, step_batches(job, phases, **how))
    assert not result.rejected, result.rejected


def step_batches(
    job: str,
    phases: Mapping[str, float],
    *,
    end: datetime,
    seconds: float = 120.0,
    every_s: float = 1.0,
    ranks: int = 2,
    slow: Mapping[int, float] | None = None,
    noise: float = 0.0,
    step_over: float = 0.0,
    first_rank: int = 0,
    seed: int = 7,
) -> list[SeriesBatch]:
    """Steps of every rank in ``[end - seconds, end)``, one every ``every_s``: phase seconds
    from ``phases`` (``grad_sync`` the wait after the slowest rank's compute plus its own
    figure), forward and backward scaled by ``slow[rank]``, each phase times a uniform factor
    in ``1 +- noise``; ``step_over`` seconds per step outside every phase."""
    rng = random.Random(seed)
    count = int(seconds / every_s)
    start = end - timedelta(seconds=seconds)
    per_rank: dict[int, list[Span]] = {r: [] for r in range(ranks)}
    for i in range(count):
        t0 = int((start + timedelta(seconds=i * every_s)).timestamp() * NS)
        busy: dict[int, dict[str, float]] = {}
        for rank in range(ranks):
            factor = (slow or {}).get(rank, 1.0)
            busy[rank] = {
                p: s * (factor if p in COMPUTE else 1.0) * (1 + noise * rng.uniform(-1, 1))
                for p, s in phases.items()
                if p != "grad_sync"
            }
        slowest = max(sum(b.values()) for b in busy.values())
        for rank in range(ranks):
            own = dict(busy[rank])
            if "grad_sync" in phases:
                own["grad_sync"] = slowest - sum(busy[rank].values()) + phases["grad_sync"]
            per_rank[rank] += _step_spans(i, rank, t0, own, step_over)
    batches: list[SeriesBatch] = []
    for rank, spans in per_rank.items():
        identity = {"tuneloop.job": job, "tuneloop.rank": first_rank + rank}
        batches += mapped_spans(spans, identity)
    return batches


def _step_spans(
    i: int, rank: int, t0: int, phases: Mapping[str, float], step_over: float
) -> list[Span]:
    trace = i.to_bytes(8, "big") + rank.to_bytes(8, "big")
    step_id = b"\x00" * 7 + b"\x01"
    spans = []
    t = t0
    for k, phase in enumerate(p for p in ORDER if p in phases):
        length = int(phases[phase] * NS)
        spans.append(
            span(
                f"tuneloop.phase.{phase}",
                t,
                t + length,
                span_id=b"\x00" * 7 + bytes([k + 2]),
                parent=step_id,
                trace_id=trace,
            )
        )
        t += length
    step_end = t + int(step_over * NS)
    step = span(
        "tuneloop.step",
        t0,
        step_end,
        span_id=step_id,
        trace_id=trace,
        labels={"tuneloop.step": i},
    )
    return [step, *spans]


def mapped_spans(spans: list[Span], resource: Mapping[str, str | int]) -> list[SeriesBatch]:
    """The series the OTLP receiver makes of one export request of ``spans``."""
    mapped = map_spans(traces_request(spans, resource), now=utcnow(), max_series=10_000)
    assert not mapped.rejections.total, mapped.rejections
    return mapped.batches


def write_gauge(
    engine: Engine,
    project_id: int,
    metric: str,
    labels: dict[str, str],
    value: float,
    *,
    end: datetime,
    seconds: float = 120.0,
    every_s: float = 5.0,
) -> None:
    """A gauge (a DCGM field, or a step-timing series a third-party exporter writes) holding
    ``value`` over ``[end - seconds, end)``."""
    count = int(seconds / every_s)
    times = [end - timedelta(seconds=seconds - i * every_s) for i in range(count)]
    batch = SeriesBatch(metric, labels, times, [value] * count)
    result = SampleWriter(engine).write(project_id, [batch])
    assert not result.rejected, result.rejected
