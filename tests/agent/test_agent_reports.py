"""What the agent reports beside its step timings (gradient norm, learning rate, samples and
tokens per step, checkpoint save times, FLOPs per sample and a declared peak) reaches the store
under tuneloop.step_timing's names, from a real agent exporting OTLP to a live API server; and
the job's diagnosis turns it into MFU."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tests.agent.conftest import Live
from tuneloop.agent import Agent
from tuneloop.agent.steps import StepTracer
from tuneloop.step_timing import (
    CHECKPOINT_DURATION,
    FLOPS_PER_SAMPLE,
    GRAD_NORM,
    LEARNING_RATE,
    PEAK_FLOPS,
    SAMPLES_PER_SECOND,
    TOKENS_PER_SECOND,
)
from tuneloop.storage import session_scope
from tuneloop.storage.models import Series, samples

JOB = "reporter"
FLOPS = 2.0e6
PEAK = 1.0e12
BATCH, SEQUENCE = 16, 128


class Lazy:
    """A value read only when exported, as a CUDA tensor is."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.reads = 0
        self.readers: set[int] = set()
        """The threads that read it."""

    def __float__(self) -> float:
        self.reads += 1
        self.readers.add(threading.get_ident())
        return self.value


def latest(live: Live, metric: str) -> dict[str, float]:
    """The latest stored value of each of ``metric``'s series of the job, by rank."""
    with session_scope(live.runtime.sessions) as session:
        found = {
            sid: labels.get("rank", "")
            for sid, labels in session.execute(
                select(Series.id, Series.labels).where(Series.metric == metric)
            )
            if labels.get("job") == JOB
        }
        rows = session.execute(
            select(samples.c.series_id, samples.c.value)
            .where(samples.c.series_id.in_(list(found)))
            .order_by(samples.c.ts)
        ).all()
    return {found[sid]: value for sid, value in rows}


def wait_for(live: Live, metrics: list[str], timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = {m: latest(live, m) for m in metrics}
        if all(seen.values()):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"not stored: {[m for m, v in seen.items() if not v]}")
        time.sleep(0.2)


def test_the_agent_reports_its_step_metrics_and_the_diagnosis_its_mfu(live: Live) -> None:
    agent = Agent(
        url=live.url,
        token=live.agent_token,
        job=JOB,
        project=live.project,
        phase_every=1,
        flops_per_sample=FLOPS,
        peak_flops_per_gpu=PEAK,
    )
    agent.start({"batch_size": BATCH})
    norm = Lazy(3.5)
    try:
        for number in range(30):
            with agent.step(number, samples=BATCH, tokens=BATCH * SEQUENCE) as step:
                assert step is not None
                with step.phase("data_loading"):  # the data-loader wait
                    time.sleep(0.001)
                with step.phase("forward"):
                    time.sleep(0.01)
            agent.record(grad_norm=norm, learning_rate=0.05 - number * 0.001)
        # Nothing read on the training thread (the exporter's may have read it by now on a
        # busy machine: that is where it is read).
        assert threading.get_ident() not in norm.readers
        with agent.checkpoint():
            time.sleep(0.05)
        agent.record_checkpoint(1.5)
        with pytest.raises(OSError), agent.checkpoint():
            raise OSError("disk full")  # a failed save is not a save time
        assert agent.tracer is not None
        agent.tracer.flush()
        seen = wait_for(
            live,
            [
                GRAD_NORM,
                LEARNING_RATE,
                FLOPS_PER_SAMPLE,
                PEAK_FLOPS,
                SAMPLES_PER_SECOND,
                TOKENS_PER_SECOND,
                f"{CHECKPOINT_DURATION}_count",
                f"{CHECKPOINT_DURATION}_sum",
            ],
        )
    finally:
        agent.close()
    assert norm.reads >= 1
    assert seen[GRAD_NORM] == {"0": 3.5}
    assert seen[LEARNING_RATE]["0"] == pytest.approx(0.05 - 29 * 0.001)
    assert seen[FLOPS_PER_SAMPLE] == {"0": FLOPS}
    assert seen[PEAK_FLOPS] == {"0": PEAK}
    assert seen[f"{CHECKPOINT_DURATION}_count"] == {"0": 2.0}
    assert seen[f"{CHECKPOINT_DURATION}_sum"]["0"] == pytest.approx(1.55, abs=0.2)
    rate = seen[SAMPLES_PER_SECOND]["0"]
    assert seen[TOKENS_PER_SECOND]["0"] == pytest.approx(rate * SEQUENCE)

    response = httpx.get(
        f"{live.job_url(JOB)}/diagnosis",
        params={"window": "5m"},
        headers={"Authorization": f"Bearer {live.member_token}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    work = response.json()["efficiency"]
    assert work["peak_source"] == "job" and work["peak_flops"] == PEAK
    assert work["excluded"] is None
    assert work["flops_per_sample"] == FLOPS
    # Per-step rates of about BATCH / 11 ms, far under the declared peak.
    assert 0 < work["mfu"] < 0.01
    assert math.isclose(work["mfu"], work["achieved_flops"] / PEAK)
    assert any(line.startswith("MFU ") for line in response.json()["evidence"])


def test_a_flops_figure_that_is_not_positive_is_refused() -> None:
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="flops_per_sample must be a positive number"):
            StepTracer(None, None, "j", span_processor=_null(), flops_per_sample=bad)


def _null() -> Any:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    return SimpleSpanProcessor(InMemorySpanExporter())


def test_the_flops_and_the_peak_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNELOOP_FLOPS_PER_SAMPLE", "2.5e9")
    monkeypatch.setenv("TUNELOOP_PEAK_FLOPS_PER_GPU", "1.2e14")
    # Nothing listens at the url: the exporters' last export on shutdown gives up after a
    # second instead of retrying for their default ten.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    agent = Agent.from_env(
        url="http://127.0.0.1:9", token="-", job="j", rank=1, world_size=2, tracer=None
    )
    try:
        assert agent.tracer is not None
        assert (agent.tracer.flops_per_sample, agent.tracer.peak_flops_per_gpu) == (2.5e9, 1.2e14)
    finally:
        assert agent.tracer is not None
        agent.tracer.shutdown()
