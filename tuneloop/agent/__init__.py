"""The job-side agent SDK, distribution ``tuneloop-agent`` (``agent/pyproject.toml``): light
on dependencies (httpx; the OpenTelemetry SDK and OTLP/HTTP exporter for step instrumentation;
the job's own torch only for :mod:`tuneloop.agent.torch`), no server packages.

::

    from tuneloop.agent import Agent

    agent = Agent.from_env()  # TUNELOOP_URL, TUNELOOP_TOKEN, TUNELOOP_JOB, RANK, WORLD_SIZE
    agent.start({"batch_size": 32, "sync_period": 1})
    for step in range(steps):
        new = agent.pending()  # rank 0; see tuneloop.agent.torch for every rank at once
        ...
        with agent.step(step, samples=32) as timed:
            with timed.phase("forward"):
                ...
    agent.close()

See ``docs/agent.md``.
"""

from tuneloop.agent.agent import Agent
from tuneloop.agent.client import ControlPlaneClient, ProtocolError, RankInfo, Released
from tuneloop.agent.noise import GradientNoiseScale
from tuneloop.agent.power import GpuPowerLimit, PowerLimitRefused
from tuneloop.agent.subscription import ConfigSubscription

__all__ = [
    "Agent",
    "ConfigSubscription",
    "ControlPlaneClient",
    "GpuPowerLimit",
    "GradientNoiseScale",
    "PowerLimitRefused",
    "ProtocolError",
    "RankInfo",
    "Released",
]
