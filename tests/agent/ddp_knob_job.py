"""One rank of a tiny 2-rank DDP job (gloo, CPU) declaring the built-in DDP knobs
(``bucket_mb``, ``grad_compression``) for tests/agent/test_ddp_comm_knobs.py: it trains until a
released config changes both, runs a few steps more, and writes what it ran with.

    python -m tests.agent.ddp_knob_job URL TOKEN PROJECT JOB OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tuneloop.agent import Agent
from tuneloop.agent.torch import TunedTraining

STEPS_AFTER = 5
MAX_STEPS = 20_000


def main(url: str, token: str, project: str, job: str, out_dir: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(16, 4), bucket_cap_mb=25)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    data = [(torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,))) for _ in range(8)]
    agent = Agent(
        url=url,
        token=token,
        project=project,
        job=job,
        rank=rank,
        world_size=world,
        instrument=False,
        poll_timeout_s=2,
    )
    training = TunedTraining(
        agent,
        model,
        optimizer,
        lambda _batch: data,
        config={"batch_size": 8},
        lr_scaling=None,
        noise_every=0,
        bucket_mb=(1, 64),
        grad_compression=False,
    )
    wrappers = {id(training.model)}
    changed_at = None
    step = 0
    while step < MAX_STEPS and (changed_at is None or step < changed_at + STEPS_AFTER):
        if training.boundary(step):
            changed_at = step
            wrappers.add(id(training.model))
        with training.step(step):
            for x, y in training.micro_batches():
                nn.functional.cross_entropy(training.model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        step += 1
    weights = [p.detach().clone() for p in training.model.parameters()]
    gathered: list[list[torch.Tensor] | None] = [None] * world
    dist.all_gather_object(gathered, weights)
    same = all(torch.equal(a, b) for a, b in zip(gathered[0] or [], gathered[1] or []))
    result = {
        "knobs": training.knob_values,
        "history": training.history,
        "bucket_bytes_cap": training.model.bucket_bytes_cap,
        "wrappers": len(wrappers),
        "ranks_agree": same,
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    agent.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:6])
