"""The learning rate the job's agent sets for a config without one is the rate the tuner writes
into that config (:mod:`tuneloop.learning_rate` is the one rule), for both scalings and both
sync modes. The agent is a real one for rank 1 of 2, which talks to no control plane."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tuneloop.agent import Agent
from tuneloop.agent.torch import TunedTraining
from tuneloop.learning_rate import LR_SCALINGS, SYNC_MODES, LrScaling, SyncMode
from tuner.space import SearchSpace

BASE_LR, BASE_BATCH = 0.1, 64
CONFIGS = [(8, 1), (32, 4), (256, 2), (16, 8)]


def agent_learning_rate(scaling: LrScaling, sync_mode: SyncMode, batch: int, period: int) -> float:
    # World size 1 (no process group), so the agent's rank does not change the batch.
    agent = Agent(
        url="http://127.0.0.1:9", token="-", job="j", rank=1, world_size=2, instrument=False
    )
    model = nn.Linear(2, 2)
    training = TunedTraining(
        agent,
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        lambda size: [(torch.zeros(size, 2), torch.zeros(size, dtype=torch.int64))],
        config={"batch_size": batch, "sync_period": period},
        lr_scaling=scaling,
        base_lr=BASE_LR,
        base_batch=BASE_BATCH,
        sync_mode=sync_mode,
    )
    agent.close()
    return training.learning_rate


@pytest.mark.parametrize("sync_mode", SYNC_MODES)
@pytest.mark.parametrize("scaling", LR_SCALINGS)
def test_the_agent_and_the_tuner_give_a_config_the_same_learning_rate(
    scaling: LrScaling, sync_mode: SyncMode
) -> None:
    space = SearchSpace.training(
        (1, 1024),
        (1, 16),
        lr_scaling=scaling,
        base_lr=BASE_LR,
        base_batch=BASE_BATCH,
        sync_mode=sync_mode,
    )
    for batch, period in CONFIGS:
        tuner_lr = space.desired({"batch_size": batch, "sync_period": period}, ranks=1)
        agent_lr = agent_learning_rate(scaling, sync_mode, batch, period)
        assert agent_lr == pytest.approx(tuner_lr["learning_rate"], rel=1e-12), (batch, period)


def test_local_sgd_does_not_scale_the_learning_rate_with_the_sync_period() -> None:
    # One local step sees batch_size samples per rank, however many precede the averaging.
    rates = [agent_learning_rate("linear", "local_sgd", 32, period) for period in (1, 2, 8)]
    assert rates == [pytest.approx(BASE_LR * 32 / BASE_BATCH)] * 3


def test_an_unknown_sync_mode_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="sync_mode must be accumulate or local_sgd"):
        agent_learning_rate("linear", "async", 8, 1)  # type: ignore[arg-type]
