"""``GpuPowerLimit`` on a fake NVML (``FakeNvml`` with ``FakeGpuPower``): the range it reads,
all-or-nothing changes across GPUs, the refusals in words, and, with the collector reading the
same boards, energy counters whose growth follows the limit it sets, into the store and out as
the per-joule objective's power (SQLite and PostgreSQL)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pynvml
import pytest
from sqlalchemy import Engine

from collector.points import to_batches
from collector.sources.nvml import NvmlSource
from tests.collector.fake_gpu_power import FakeGpuPower, ManualClock
from tests.collector.fakes import FakeNvml, FakeNvmlDevice, h100_answers
from tests.tuner import jobsim
from tuneloop.agent import Agent, GpuPowerLimit, PowerLimitRefused
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow
from tuner.readings import gpu_power


def boards(*powers: FakeGpuPower | None) -> FakeNvml:
    return FakeNvml(
        [
            FakeNvmlDevice(
                h100_answers(uuid=f"GPU-{i}", bus_id=f"00000000:{18 + i:02X}:00.0", minor=i),
                power=power,
            )
            for i, power in enumerate(powers)
        ]
    )


def started(nvml: FakeNvml) -> GpuPowerLimit:
    limit = GpuPowerLimit(nvml=nvml)
    limit.start()
    return limit


def test_a_gpu_that_refuses_leaves_every_gpu_as_it_was() -> None:
    nvml = boards(FakeGpuPower(), FakeGpuPower(refuse_with=pynvml.NVML_ERROR_NO_PERMISSION))
    limit = started(nvml)
    with pytest.raises(PowerLimitRefused, match="GPU 1 refused 450 W: Insufficient Permissions"):
        limit.apply(450)
    first = nvml.devices[0].power
    assert first is not None
    assert first.sets == [450_000, 700_000], "GPU 0 was set, then put back"
    assert limit.current_w is None


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"power_limit_w": 150}, "150 W is outside what the GPUs allow (250-650 W)"),
        ({"power_limit_w": 300.5}, "must be a whole number of watts, got 300.5"),
        ({"power_limit_w": True}, "must be a whole number of watts, got True"),
    ],
)
def test_bad_limits_are_refused_before_nvml_is_asked(config: dict[str, Any], words: str) -> None:
    # The range is what every GPU allows: the narrower board bounds it.
    nvml = boards(FakeGpuPower(), FakeGpuPower(min_mw=250_000, max_mw=650_000))
    limit = started(nvml)
    assert limit.describe()["min_w"] == 250 and limit.describe()["max_w"] == 650
    with pytest.raises(PowerLimitRefused, match=re.escape(words)):
        limit.apply_config(config)
    assert all(d.power is not None and d.power.sets == [] for d in nvml.devices)


def test_a_board_without_power_management_refuses_the_knob_but_not_the_job() -> None:
    agent = Agent(
        url="http://127.0.0.1:9",
        token="tl_x",
        job="train",
        rank=1,
        world_size=2,
        instrument=False,
        power=GpuPowerLimit(nvml=boards(None)),
    )
    agent.start({"batch_size": 8})
    agent.apply_power({"batch_size": 16})  # no power_limit_w: nothing to set
    with pytest.raises(PowerLimitRefused, match=r"NVML: Not Supported .*no settable power limit"):
        agent.apply_power({"batch_size": 16, "power_limit_w": 300})
    agent.close()


def test_an_agent_started_without_the_knob_refuses_a_config_that_sets_it() -> None:
    agent = Agent(
        url="http://127.0.0.1:9", token="tl_x", job="t", rank=1, world_size=2, instrument=False
    )
    with pytest.raises(PowerLimitRefused, match=r"started without a power limit"):
        agent.apply_power({"power_limit_w": 300})


def per_rank_samples_s(limit_w: int) -> float:
    """A compute-bound job: throughput grows with the power it may draw, less than in
    proportion (clocks and voltage scale together)."""
    return 2.0 * min(limit_w, 650) ** 0.6


def test_collected_energy_follows_the_limit_the_agent_sets(engine: Engine) -> None:
    clock = ManualClock()
    nvml = boards(FakeGpuPower(clock=clock), FakeGpuPower(clock=clock))
    limit = started(nvml)
    source = NvmlSource(nvml, hostname="node-1")  # the collector, on the same host
    source.start()
    with session_scope(session_factory(engine)) as session:
        project_id = jobsim.make_job(session).project_id
    writer = SampleWriter(engine)
    t0 = utcnow() - timedelta(hours=1)
    per_joule: dict[int, float] = {}
    for n, watts in enumerate((700, 500, 300)):
        limit.apply(watts)
        start = t0 + timedelta(minutes=2 * n)
        for tick in range(13):  # every 5 s for a minute
            points = source.collect(start + timedelta(seconds=5 * tick))
            assert not writer.write(project_id, to_batches(points)).rejected
            clock.advance(5)
        clock.advance(60)  # between windows
        power = gpu_power(
            StoreBackend(engine),
            project_id,
            "train",
            ("GPU-0", "GPU-1"),
            start=start - timedelta(seconds=1),
            end=start + timedelta(seconds=60),
        )
        assert power is not None
        # The boards draw what the workload demands (650 W) up to the limit.
        assert power.watts == pytest.approx(2 * min(650, watts))
        per_joule[watts] = 2 * per_rank_samples_s(watts) / power.watts
    limit.close()
    source.shutdown()
    assert per_joule[300] > per_joule[500] > per_joule[700]
    assert all(d.power is not None and d.power.limit_mw == 700_000 for d in nvml.devices)


def offline_agent(nvml: FakeNvml) -> Agent:
    """Rank 1: no control plane needed (only rank 0 talks to it)."""
    return Agent(
        url="http://127.0.0.1:9",
        token="tl_x",
        job="train",
        rank=1,
        world_size=2,
        instrument=False,
        power=GpuPowerLimit(nvml=nvml),
    )


def test_the_starting_config_s_limit_is_set_and_one_refused_is_dropped() -> None:
    nvml = boards(FakeGpuPower())
    agent = offline_agent(nvml)
    agent.start({"batch_size": 8, "power_limit_w": 400})
    assert agent.config == {"batch_size": 8, "power_limit_w": 400}
    assert nvml.devices[0].power is not None and nvml.devices[0].power.limit_mw == 400_000
    agent.close()
    assert nvml.devices[0].power.limit_mw == 700_000

    refusing = boards(FakeGpuPower(refuse_with=pynvml.NVML_ERROR_NO_PERMISSION))
    agent = offline_agent(refusing)
    agent.start({"batch_size": 8, "power_limit_w": 400})
    # The job runs at the limit found, and its config says so.
    assert agent.config == {"batch_size": 8, "power_limit_w": 700}
    agent.close()
