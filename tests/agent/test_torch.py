"""The PyTorch integration in one process (no process group): a released config changes the
data loader's batch size, the sync period and the learning rate at a step boundary. The
2-rank DistributedDataParallel case is tests/agent/test_ddp_integration.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch import nn

from tests.agent.conftest import Live
from tests.agent.test_subscription import desire, make_agent, wait_for
from tuneloop.agent import Agent
from tuneloop.agent.steps import StepTracer
from tuneloop.agent.torch import TunedTraining


def make_loader(batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    y = torch.randint(0, 2, (64,), generator=generator)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, 64, batch)]


def train_until(training: TunedTraining, model: nn.Module, steps: range, stop: Any) -> int:
    for step in steps:
        training.boundary(step)
        if stop():
            return step
        with training.step(step) as timed:
            for x, y in training.micro_batches(timed):
                with timed.phase("forward"):
                    loss = nn.functional.cross_entropy(model(x), y) / training.sync_period
                loss.backward()
            training.optimizer.step()
            training.optimizer.zero_grad()
    raise AssertionError("the config never arrived")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_batch_size_sync_period_and_lr_change_live(live: Live) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    agent = make_agent(live)
    training = TunedTraining(
        agent,
        model,
        optimizer,
        make_loader,
        config={"batch_size": 8, "sync_period": 1},
        lr_scaling="linear",
        base_lr=0.1,
        base_batch=8,
    )
    try:
        assert training.learning_rate == pytest.approx(0.1)
        wait_for(lambda: agent.pending() is None and agent.version == 1)
        desire(live, {"batch_size": 16, "sync_period": 2})
        step = train_until(training, model, range(10_000), lambda: training.version == 2)
        assert training.history[-1] == (2, step)
        assert (training.batch_size, training.sync_period) == (16, 2)
        assert training.learning_rate == pytest.approx(0.1 * 16 * 2 / 8)
        sizes = [len(x) for x, _ in training.micro_batches()]
        assert sizes == [16, 16]

        desire(live, {"batch_size": 4, "sync_period": 1, "learning_rate": 0.05})
        train_until(training, model, range(step, step + 10_000), lambda: training.version == 3)
        assert (training.batch_size, training.learning_rate) == (4, pytest.approx(0.05))

        # A config the job cannot run is refused at the boundary and never acknowledged.
        desire(live, {"batch_size": 0})
        wait_for(agent.pending)
        assert training.boundary(10**6) is False
        assert training.version == 3 and training.batch_size == 4
    finally:
        agent.close()


def test_each_step_reports_its_samples_tokens_learning_rate_and_gradient_norm() -> None:
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer = StepTracer(
        None, None, "j", rank=1, span_processor=SimpleSpanProcessor(spans), metric_reader=reader
    )
    agent = Agent(url="http://127.0.0.1:9", token="-", job="j", rank=1, world_size=2, tracer=tracer)
    model = nn.Linear(4, 2)
    training = TunedTraining(
        agent,
        model,
        torch.optim.SGD(model.parameters(), lr=0.25),
        make_loader,
        config={"batch_size": 8, "sync_period": 2},
        lr_scaling=None,
        tokens_per_sample=32,
    )
    norms = []
    for step in range(3):
        with training.step(step) as timed:
            for x, y in training.micro_batches(timed):
                nn.functional.cross_entropy(model(x), y).backward()
            timed.grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
            norms.append(float(timed.grad_norm))
            training.optimizer.step()
            training.optimizer.zero_grad()
    step_span = [s for s in spans.get_finished_spans() if s.name == "tuneloop.step"][-1]
    assert step_span.attributes is not None
    assert step_span.attributes["tuneloop.samples"] == 16
    assert step_span.attributes["tuneloop.tokens"] == 16 * 32
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        m.name: [(p.value, dict(p.attributes or {})) for p in m.data.data_points]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert points["tuneloop.learning_rate"] == [(0.25, {"rank": "1"})]
    assert points["tuneloop.grad_norm"] == [(pytest.approx(norms[-1]), {"rank": "1"})]
    agent.close()
