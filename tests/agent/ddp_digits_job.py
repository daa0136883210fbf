"""A real 2-rank PyTorch DistributedDataParallel job (gloo, CPU) with the tuneloop agent: a
small CNN on scikit-learn's bundled digits, batch size, learning rate and sync period set live
by the control plane through :class:`tuneloop.agent.torch.TunedTraining`.

Each micro-batch waits ``--input-delay-ms`` in its data-loading phase (an input pipeline's
latency), so that throughput depends on the batch size as on real hardware and the job does
not flood a small test machine with spans.

One process per rank, started as torchrun would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` in the environment); the model, the digits (``DATA``, written by
:func:`save_digits`, so that the ranks need not import scikit-learn) and the loaders are the
demo job's (:mod:`tuneloop.demo.job`); this job trains on the training split. Runs
until ``STOP_FILE`` exists (checked by rank 0 every 10 steps, broadcast to both ranks), then
writes ``OUT_DIR/rank<N>.json``: the (version, step) of every config applied, the final config
and the gradient noise scale estimate::

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        python -m tests.agent.ddp_digits_job URL TOKEN PROJECT JOB DATA OUT_DIR STOP_FILE
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tuneloop.agent import Agent
from tuneloop.agent.torch import TunedTraining
from tuneloop.demo.job import build_model, load_shard, loader_factory
from tuneloop.demo.job import save_digits as save_digits  # the test writes the data with it

WORLD_SIZE = 2
START_CONFIG = {"batch_size": 16, "sync_period": 1}


def run_rank(rank: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    (x, y), _ = load_shard(Path(args.data), rank, WORLD_SIZE)
    agent = Agent(
        url=args.url,
        token=args.token,
        project=args.project,
        job=args.job,
        rank=rank,
        world_size=WORLD_SIZE,
        poll_timeout_s=2,
    )
    training = TunedTraining(
        agent,
        model,
        optimizer,
        loader_factory(x, y, seed=rank),
        config=START_CONFIG,
        lr_scaling="sqrt",
        base_lr=0.05,
        base_batch=32,
        noise_every=5,
    )
    delay_s = args.input_delay_ms / 1000
    stop_file = Path(args.stop_file)
    step = 0
    while True:
        if step % 10 == 0:
            stop = torch.tensor([int(rank == 0 and stop_file.exists())])
            dist.broadcast(stop, src=0)
            if stop.item():
                break
        training.boundary(step)
        with training.step(step) as timed:
            for xb, yb in training.micro_batches(timed):
                with timed.phase("data_loading"):
                    time.sleep(delay_s)
                with timed.phase("forward"):
                    loss = nn.functional.cross_entropy(model(xb), yb) / training.sync_period
                with timed.phase("backward"):
                    loss.backward()
            with timed.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
        step += 1
    result: dict[str, Any] = {
        "rank": rank,
        "steps": step,
        "history": training.history,
        "config": training.config,
        "learning_rate": training.learning_rate,
        "noise_scale": agent.noise_scale.value,
    }
    Path(args.out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    agent.close()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    for name in ("url", "token", "project", "job", "data", "out_dir", "stop_file"):
        parser.add_argument(name)
    parser.add_argument("--input-delay-ms", type=float, default=4.0)
    args = parser.parse_args()
    run_rank(int(os.environ["RANK"]), args)


if __name__ == "__main__":
    main()
