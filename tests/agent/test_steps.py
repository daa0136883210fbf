"""Step instrumentation follows docs/step-timing.md: names, parents, attributes, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tuneloop.agent.steps import StepTracer


def test_step_and_phase_spans() -> None:
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    tracer = StepTracer(
        None,
        None,
        "llama",
        rank=1,
        span_processor=SimpleSpanProcessor(exporter),
        metric_reader=reader,
    )
    with tracer.step(7, samples=64) as step:
        with step.phase("forward"):
            pass
        with step.phase("checkpoint"):
            pass
    with pytest.raises(RuntimeError), tracer.step(8) as failing, failing.phase("forward"):
        raise RuntimeError("CUDA out of memory")
    tracer.set_noise_scale(812.5)
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [
        "tuneloop.phase.forward",
        "tuneloop.phase.checkpoint",
        "tuneloop.step",
        "tuneloop.phase.forward",
        "tuneloop.step",
    ]
    step_span = spans[2]
    assert dict(step_span.attributes or {}) == {"tuneloop.step": 7, "tuneloop.samples": 64}
    assert spans[0].parent is not None and step_span.context is not None
    assert spans[0].parent.span_id == step_span.context.span_id
    assert step_span.resource.attributes["tuneloop.job"] == "llama"
    assert step_span.resource.attributes["tuneloop.rank"] == 1
    assert spans[4].status.status_code.name == "ERROR"  # a failed step is not timed
    data = reader.get_metrics_data()
    assert data is not None
    [metric] = [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    assert metric.name == "tuneloop.gradient_noise_scale"
    assert [p.value for p in metric.data.data_points] == [812.5]
    tracer.shutdown()


def test_the_agent_imports_no_server_package() -> None:
    program = (
        "import sys, tuneloop.agent, tuneloop.agent.steps\n"
        "server = {'sqlalchemy', 'fastapi', 'starlette', 'uvicorn', 'celery', 'alembic',"
        " 'psycopg', 'pydantic_settings', 'redis', 'skopt', 'api', 'collector', 'tuner',"
        " 'actuators'}\n"
        "loaded = sorted(server & {name.split('.')[0] for name in sys.modules})\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_steps_phases_reach_the_exporter_with_their_step() -> None:
    """A batch processor exporting on a timer must not split a step: its phases are handed on
    only when the step ends (otherwise early phases are stored as separate samples)."""
    exporter = InMemorySpanExporter()
    tracer = StepTracer(None, None, "llama", span_processor=SimpleSpanProcessor(exporter))
    with tracer.step(1) as step:
        with step.phase("data_loading"):
            pass
        with step.phase("forward"):
            pass
        assert exporter.get_finished_spans() == ()  # held while the step runs
        with step.phase("backward"):
            pass
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == [
        "tuneloop.phase.data_loading",
        "tuneloop.phase.forward",
        "tuneloop.phase.backward",
        "tuneloop.step",
    ]
    tracer.shutdown()
