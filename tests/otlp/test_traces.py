"""Step spans -> step-timing series (the conventions of docs/step-timing.md)."""

from __future__ import annotations

from datetime import timedelta

from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from collector.otlp.traces import MappedSpans, map_spans
from tests.otlp.builders import NOW, SECOND, T0_NS, Attrs, span, traces_request
from tuneloop.storage.timeseries.types import SeriesKind

MS = SECOND // 1000
T0 = NOW - timedelta(hours=1)
STEP_ATTRS: Attrs = {"tuneloop.job": "llama", "tuneloop.rank": 3, "tuneloop.step": 41}


def mapped(spans: list[Span], resource: Attrs | None = None, max_series: int = 100) -> MappedSpans:
    return map_spans(traces_request(spans, resource), now=NOW, max_series=max_series)


Key = tuple[str, tuple[tuple[str, str], ...]]


def values(result: MappedSpans) -> dict[Key, list[float]]:
    return {key(b.metric, **b.labels): list(b.values) for b in result.batches}


def key(metric: str, **labels: str) -> Key:
    return metric, tuple(sorted(labels.items()))


def one_step(
    step_id: bytes = b"S" * 8, start_ns: int = T0_NS, **attrs: str | int | float
) -> list[Span]:
    """A 500 ms step with 64 samples and 8192 tokens: data loading 50 ms, two micro-batches of
    forward (100 + 100 ms) and backward (120 + 110 ms), then optimizer 20 ms."""
    t = start_ns
    step_attrs = {**STEP_ATTRS, "tuneloop.samples": 64, "tuneloop.tokens": 8192, **attrs}
    spans = [span("tuneloop.step", t, t + 500 * MS, span_id=step_id, labels=step_attrs)]
    phases = [
        ("data_loading", 0, 50),
        ("forward", 50, 150),
        ("backward", 150, 270),
        ("forward", 270, 370),
        ("backward", 370, 480),
        ("optimizer", 480, 500),
    ]
    for i, (phase, begin, end) in enumerate(phases):
        spans.append(
            span(
                f"tuneloop.phase.{phase}",
                t + begin * MS,
                t + end * MS,
                span_id=bytes([i]) * 8,
                parent=step_id,
            )
        )
    return spans


def test_a_step_with_its_phases() -> None:
    result = mapped(one_step())
    ids = {"job": "llama", "rank": "3"}
    phase = "tuneloop_step_phase_seconds"
    assert values(result) == {
        key("tuneloop_step_duration_seconds", **ids): [0.5],
        key("tuneloop_step_number", **ids): [41.0],
        key("tuneloop_samples_per_second", **ids): [128.0],
        key("tuneloop_tokens_per_second", **ids): [16384.0],
        key(phase, **ids, phase="data_loading"): [0.05],
        key(phase, **ids, phase="forward"): [0.2],
        key(phase, **ids, phase="backward"): [0.23],
        key(phase, **ids, phase="optimizer"): [0.02],
    }
    end = T0 + timedelta(milliseconds=500)
    assert all(list(b.timestamps) == [end] for b in result.batches)  # all at the step's end
    assert all(b.kind is SeriesKind.GAUGE for b in result.batches)
    assert (result.spans, result.accepted) == (7, 7)


def test_several_steps_and_ranks_in_one_request() -> None:
    spans = one_step(b"A" * 8) + one_step(b"B" * 8, T0_NS + SECOND, **{"tuneloop.step": 42})
    spans += one_step(b"C" * 8, **{"tuneloop.rank": 0})
    result = mapped(spans)
    found = values(result)
    assert found[key("tuneloop_step_number", job="llama", rank="3")] == [41.0, 42.0]
    forward = key("tuneloop_step_phase_seconds", job="llama", rank="3", phase="forward")
    assert found[forward] == [0.2, 0.2]
    assert key("tuneloop_step_number", job="llama", rank="0") in found


def test_job_and_rank_from_the_resource_or_service_name_and_rank_defaults_to_zero() -> None:
    step = span("tuneloop.step", T0_NS, T0_NS + SECOND, span_id=b"s" * 8)
    from_resource = mapped([step], {"tuneloop.job": "bert", "tuneloop.rank": 2})
    assert values(from_resource) == {
        key("tuneloop_step_duration_seconds", job="bert", rank="2"): [1.0]
    }
    from_service = mapped([step], {"service.name": "gpt"})
    assert values(from_service) == {
        key("tuneloop_step_duration_seconds", job="gpt", rank="0"): [1.0]
    }
    unnamed = mapped([step], {"service.name": "unknown_service:python"})
    assert unnamed.batches == [] and dict(unnamed.rejections.counts) == {"missing_job": 1}


def test_phases_whose_step_is_in_another_request_use_their_own_or_resource_identity() -> None:
    # The SDK's batch processor can split a step: its phases end (and export) first.
    orphan = span(
        "tuneloop.phase.forward", T0_NS, T0_NS + 300 * MS, span_id=b"f" * 8, parent=b"p" * 8
    )
    result = mapped([orphan], {"tuneloop.job": "bert", "tuneloop.rank": 1})
    assert values(result) == {
        ("tuneloop_step_phase_seconds", (("job", "bert"), ("phase", "forward"), ("rank", "1"))): [
            0.3
        ]
    }
    assert list(result.batches[0].timestamps) == [T0 + timedelta(milliseconds=300)]


def test_phases_under_intermediate_spans_count_for_their_step() -> None:
    # step -> micro-batch spans (not tuneloop's) -> forward phases
    step = span("tuneloop.step", T0_NS, T0_NS + SECOND, span_id=b"S" * 8, labels=STEP_ATTRS)
    spans = [step]
    for i in range(2):
        micro = bytes([i + 1]) * 8
        spans.append(span("micro_batch", T0_NS, T0_NS + SECOND, span_id=micro, parent=b"S" * 8))
        start = T0_NS + i * 200 * MS
        forward = span(
            "tuneloop.phase.forward",
            start,
            start + 100 * MS,
            span_id=b"f" * 7 + bytes([i]),
            parent=micro,
        )
        spans.append(forward)
    result = mapped(spans)
    forward_key = key("tuneloop_step_phase_seconds", job="llama", rank="3", phase="forward")
    assert values(result)[forward_key] == [0.2]
    phase_batch = next(b for b in result.batches if b.labels.get("phase") == "forward")
    assert list(phase_batch.timestamps) == [T0 + timedelta(seconds=1)]  # the step's end


def test_parent_links_that_loop_do_not_hang() -> None:
    a = span("x", T0_NS, T0_NS + 1, span_id=b"a" * 8, parent=b"b" * 8)
    b = span("y", T0_NS, T0_NS + 1, span_id=b"b" * 8, parent=b"a" * 8)
    phase = span("tuneloop.phase.forward", T0_NS, T0_NS + 1, span_id=b"p" * 8, parent=b"a" * 8)
    result = mapped([a, b, phase], {"tuneloop.job": "j"})
    assert result.accepted == 3 and len(result.batches) == 1


def test_custom_phases_are_accepted_and_other_spans_ignored() -> None:
    spans = one_step()[:1]
    spans.append(
        span("tuneloop.phase.checkpoint", T0_NS, T0_NS + MS, span_id=b"c" * 8, parent=b"S" * 8)
    )
    spans.append(span("HTTP GET", T0_NS, T0_NS + MS, span_id=b"h" * 8))
    result = mapped(spans)
    assert any(b.labels.get("phase") == "checkpoint" for b in result.batches)
    assert (result.spans, result.rejections.total) == (3, 0)


def test_failed_steps_are_accepted_but_not_timed() -> None:
    spans = one_step()
    for s in spans:
        s.status.code = Status.STATUS_CODE_ERROR
    result = mapped(spans)
    assert result.batches == [] and result.rejections.total == 0


def test_broken_tuneloop_spans_are_rejected_by_reason_and_the_rest_kept() -> None:
    good = one_step()
    bad = [
        span("tuneloop.step", T0_NS + SECOND, T0_NS, span_id=b"1" * 8, labels=STEP_ATTRS),
        span("tuneloop.step", 0, SECOND, span_id=b"2" * 8, labels=STEP_ATTRS),
        span(
            "tuneloop.step",
            T0_NS,
            T0_NS + 1,
            span_id=b"3" * 8,
            labels={**STEP_ATTRS, "tuneloop.samples": "many"},
        ),
        span(
            "tuneloop.step",
            T0_NS,
            T0_NS + 1,
            span_id=b"4" * 8,
            labels={**STEP_ATTRS, "tuneloop.samples": -1},
        ),
        span(
            "tuneloop.step",
            T0_NS,
            T0_NS + 1,
            span_id=b"5" * 8,
            labels={**STEP_ATTRS, "tuneloop.step": 1.5},
        ),
        span(
            "tuneloop.step",
            T0_NS,
            T0_NS + 1,
            span_id=b"6" * 8,
            labels={**STEP_ATTRS, "tuneloop.job": "j" * 3000},
        ),
        span("tuneloop.phase.Forward", T0_NS, T0_NS + 1, span_id=b"7" * 8, parent=b"S" * 8),
        span("tuneloop.phase.", T0_NS, T0_NS + 1, span_id=b"8" * 8, parent=b"S" * 8),
        span("tuneloop.stepp", T0_NS, T0_NS + 1, span_id=b"9" * 8),
    ]
    result = mapped(good + bad)
    assert dict(result.rejections.counts) == {
        "invalid_span_time": 1,
        "timestamp_out_of_range": 1,
        "invalid_attribute": 3,
        "label_too_long": 1,
        "invalid_phase": 2,
        "unknown_tuneloop_span": 1,
    }
    assert (result.spans, result.accepted) == (16, 7)
    assert len(result.batches) == 8  # the good step, whole


def test_zero_duration_steps_have_no_throughput() -> None:
    step = span(
        "tuneloop.step",
        T0_NS,
        T0_NS,
        span_id=b"z" * 8,
        labels={**STEP_ATTRS, "tuneloop.samples": 8},
    )
    assert {b.metric for b in mapped([step]).batches} == {
        "tuneloop_step_duration_seconds",
        "tuneloop_step_number",
    }


def test_series_cap_rejects_whole_steps_and_phase_groups() -> None:
    result = mapped(one_step(), max_series=4)  # the step's 4 series fit; no phase does
    assert len(result.batches) == 4
    assert dict(result.rejections.counts) == {"too_many_series": 6}  # 6 phase spans
