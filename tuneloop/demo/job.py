"""The demo's training job: a real 2-rank PyTorch DistributedDataParallel job (gloo, CPU) with
the tuneloop agent, training one of the workloads of :mod:`tuneloop.demo.workloads` (``--workload``;
the demo's small CNN on scikit-learn's bundled digits by default). Its batch size, sync period and
learning rate are set live by the control plane through
:class:`tuneloop.agent.torch.TunedTraining`.

Two modes, one process per rank, started as ``torchrun`` would (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` in the environment)::

    python -m tuneloop.demo.job tune URL TOKEN PROJECT JOB DATA OUT_DIR --stop-file STOP
    python -m tuneloop.demo.job eval URL TOKEN PROJECT JOB DATA OUT_DIR --batch-size 32 ...

``DATA`` is the ``.npz`` file the workload's ``save_data`` wrote (``--workload`` names it).

- ``tune`` trains from ``--batch-size``/``--sync-period`` and applies whatever the control
  plane releases, until ``--stop-file`` exists (checked every 10 steps, decided by rank 0).
  Its workload is a stream of training runs of the same model: each time the validation
  accuracy reaches the target, the weights and the optimizer's state start afresh (an
  *episode*), as when a model is retrained on new data again and again. So the gradient noise
  scale the agent reports, and with it the goodput the tuner optimizes, is that of training
  towards the target, not of a model long past it; and each episode's time to target is a
  live measurement of the config that ran it.
- ``eval`` trains one fixed config from fresh weights (seeded) until the validation metric
  reaches ``--target`` (the workload's own by default) or the training clock passes
  ``--time-budget-s``. Evaluation runs every ``--eval-every-samples`` global samples, both ranks
  scoring half the validation set; the training clock (rank 0's) is paused while it runs, so
  **time to target** is pure training time.

Each rank writes ``OUT_DIR/rank<N>.json``, its own view: steps, the configs applied with
their steps, the final config and learning rate, the gradient noise scale estimate, throughput
(global samples/s of the rank's training time after the first ``WARMUP_STEPS`` steps) and, in
``eval``, the time to target (rank 0's clock is the demo's).

Two costs are emulated so that the knobs matter as on a real cluster, both documented in the
output and in ``docs/demo.md``: ``--input-delay-ms`` per micro-batch (an input pipeline's
latency: small batches pay it more often) and ``--sync-latency-ms`` per gradient all-reduce
(a slower interconnect than loopback: syncing less often saves it). ``--slow-rank N
--slow-rank-ms X`` makes rank ``N`` sleep ``X`` ms in each forward pass: one rank slower than
the others, as on a throttled GPU (the straggler the diagnosis names).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tuneloop.agent import Agent
from tuneloop.agent.knobs import Knob
from tuneloop.agent.torch import TunedTraining
from tuneloop.agent.torch_loader import LoaderSettings
from tuneloop.demo import workloads
from tuneloop.demo.slow_loader import slow_loader_factory
from tuneloop.demo.workloads.digits import WORKLOAD as DIGITS
from tuneloop.demo.workloads.digits import build_model as build_model
from tuneloop.demo.workloads.digits import save_digits as save_digits
from tuneloop.demo.workloads.spec import Workload, loss, score_sums

WARMUP_STEPS = 5
"""Steps left out of the throughput (the first steps build DDP's buckets and warm caches)."""
BASE_LR = DIGITS.base_lr
BASE_BATCH = DIGITS.base_batch
"""The digits job's learning rate is ``BASE_LR`` at a global batch of ``BASE_BATCH``, scaled by
sqrt (each workload has its own, :class:`~tuneloop.demo.workloads.Workload`)."""
LR_SCALING: Final = DIGITS.lr_scaling
MAX_LOADER_WORKERS: Final = 6
MAX_PREFETCH: Final = 4
"""The ranges of the loader knobs the job declares with ``--loader-workers``."""


def load_shard(
    data: Path, rank: int, world: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """This rank's half of the training set and of the validation set."""
    arrays = np.load(data)

    def part(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = torch.from_numpy(arrays[f"x_{name}"]), torch.from_numpy(arrays[f"y_{name}"])
        return x[rank::world], y[rank::world]

    return part("train"), part("val")


def loader_factory(
    x: torch.Tensor, y: torch.Tensor, seed: int
) -> Callable[[int], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Batches of one shuffled pass (a new permutation for each pass, like a sampler)."""
    passes = [0]

    def make_loader(batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        passes[0] += 1
        order = torch.randperm(
            len(y), generator=torch.Generator().manual_seed(seed * 997 + passes[0])
        )
        return [
            (x[order[i : i + batch]], y[order[i : i + batch]])
            for i in range(0, len(y) - batch + 1, batch)
        ]

    return make_loader


def score(workload: Workload, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The validation metric over every rank's share (all-reduced sums)."""
    total, count = score_sums(workload, model, x, y)
    sums = torch.tensor([total, count], dtype=torch.float64)
    dist.all_reduce(sums)
    return float(sums[0] / sums[1])


def reinitialize(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """Fresh weights (the same on every rank: same seed) and no optimizer history."""
    torch.manual_seed(seed)
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if reset is not None and module is not model:
            reset()
    optimizer.state.clear()


def decide(flag: bool) -> bool:
    """Rank 0's decision, the same on every rank."""
    box = torch.tensor([int(flag)])
    dist.broadcast(box, src=0)
    return bool(box.item())


def run(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    workload = workloads.get(args.workload)
    if args.target is not None:
        workload = replace(workload, target=args.target)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(workload.build_model())
    optimizer = workload.make_optimizer(model)
    (x, y), (x_val, y_val) = load_shard(Path(args.data), rank, world)
    agent = Agent(
        url=args.url,
        token=args.token,
        project=args.project,
        job=args.job,
        rank=rank,
        world_size=world,
        poll_timeout_s=5,
    )
    seed = args.seed * world + rank
    input_delay_s, sync_latency_s = args.input_delay_ms / 1000, args.sync_latency_ms / 1000
    knobs: list[Knob] = []
    if args.loader_workers is None:
        make_loader: Callable[[int], Iterable[Any]] = loader_factory(x, y, seed=seed)
    else:
        # A real DataLoader pays the input latency in its workers; the loop no longer does.
        loader = LoaderSettings(args.loader_workers, args.loader_prefetch)
        make_loader = slow_loader_factory(x, y, seed, input_delay_s, loader)
        knobs = loader.knobs(workers=(0, MAX_LOADER_WORKERS), prefetch=(1, MAX_PREFETCH))
        input_delay_s = 0.0
    training = TunedTraining(
        agent,
        model,
        optimizer,
        make_loader,
        knobs=knobs,
        config={"batch_size": args.batch_size, "sync_period": args.sync_period},
        lr_scaling=workload.lr_scaling,
        base_lr=workload.base_lr,
        base_batch=workload.base_batch,
        noise_every=5,
    )
    forward_delay_s = args.slow_rank_ms / 1000 if rank == args.slow_rank else 0.0
    stop_file = Path(args.stop_file) if args.stop_file else None
    eval_every = args.eval_every_samples or workload.eval_every_samples
    time_budget_s = args.time_budget_s or workload.time_budget_s
    step = 0
    samples = 0  # global samples trained, and those after the warm-up steps
    warm_samples, warm_clock = 0, 0.0
    clock = 0.0  # rank 0's training time, evaluation excluded
    since_eval = 0
    reached: float | None = None
    best: float | None = None
    evaluations: list[tuple[float, float]] = []
    episodes: list[dict[str, Any]] = []  # tune: each run to the target
    episode_started = 0.0
    while True:
        stopping = rank == 0 and stop_file is not None and stop_file.exists()
        if args.mode == "tune" and step % 10 == 0 and decide(stopping):
            break
        started = time.perf_counter()
        training.boundary(step)
        with training.step(step) as timed:
            for micro, (xb, yb) in enumerate(training.micro_batches(timed)):
                with timed.phase("data_loading"):
                    time.sleep(input_delay_s)
                last = micro == training.sync_period - 1
                with timed.phase("forward"):
                    time.sleep(forward_delay_s)
                    micro_loss = loss(training.model(xb), yb) / training.sync_period
                with timed.phase("grad_sync" if last else "backward"):
                    # the last micro-batch's backward all-reduces
                    torch.autograd.backward(micro_loss)
                    if last:
                        time.sleep(sync_latency_s)
            with timed.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
        elapsed = time.perf_counter() - started
        step_samples = training.batch_size * training.sync_period * world
        clock += elapsed
        samples += step_samples
        if step >= WARMUP_STEPS:
            warm_samples += step_samples
            warm_clock += elapsed
        step += 1
        since_eval += step_samples
        if since_eval < eval_every:
            continue
        since_eval = 0
        value = score(workload, model, x_val, y_val)  # no dropout or batch norm: no eval mode
        if args.mode == "eval":
            if best is None or workload.higher_is_better == (value > best):
                best = value
            evaluations.append((round(clock, 4), round(value, 4)))
            if workload.reached(value):
                reached = clock
            if decide(reached is not None or clock > time_budget_s):
                break
        elif workload.reached(value):
            episodes.append(
                {
                    "end_step": step,
                    "time_to_target_s": round(clock - episode_started, 4),
                    "config": dict(training.config),
                }
            )
            episode_started = clock
            reinitialize(model, optimizer, args.seed * 7919 + len(episodes))
    result: dict[str, Any] = {
        "rank": rank,
        "mode": args.mode,
        "workload": workload.name,
        "metric": workload.metric,
        "seed": args.seed,
        "steps": step,
        "samples": samples,
        "training_s": clock,
        "throughput_samples_s": warm_samples / warm_clock if warm_clock > 0 else None,
        "history": training.history,
        "config": training.config,
        "batch_size": training.batch_size,
        "sync_period": training.sync_period,
        "effective_batch": training.batch_size * training.sync_period * world,
        "learning_rate": training.learning_rate,
        "noise_scale": agent.noise_scale.value,
        "knobs": training.knob_values,
        # The loader's worker processes alive at the end: what the loader really runs with.
        "worker_processes": len(multiprocessing.active_children()),
        "emulation": {
            "input_delay_ms": args.input_delay_ms,
            "sync_latency_ms": args.sync_latency_ms,
            **(
                {"slow_rank": args.slow_rank, "slow_rank_ms": args.slow_rank_ms}
                if args.slow_rank_ms
                else {}
            ),
        },
    }
    if args.mode == "tune":
        result["episodes"] = episodes
    else:
        result.update(
            target=workload.target,
            time_to_target_s=reached,
            best_score=best,
            evaluations=evaluations,
        )
    agent.close()
    dist.destroy_process_group()
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("mode", choices=("tune", "eval"))
    for name in ("url", "token", "project", "job", "data", "out_dir"):
        parser.add_argument(name)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sync-period", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-file", default=None)
    parser.add_argument("--input-delay-ms", type=float, default=2.0)
    parser.add_argument("--sync-latency-ms", type=float, default=25.0)
    parser.add_argument("--slow-rank", type=int, default=1, help="the rank --slow-rank-ms slows")
    parser.add_argument("--slow-rank-ms", type=float, default=0.0, help="per forward pass [0]")
    parser.add_argument(
        "--loader-workers",
        type=int,
        default=None,
        help="load through a DataLoader with this many workers, which pay --input-delay-ms "
        "per batch; declares the loader_workers and prefetch_factor knobs [no DataLoader]",
    )
    parser.add_argument("--loader-prefetch", type=int, default=2, help="with --loader-workers")
    parser.add_argument("--workload", choices=workloads.names(), default=DIGITS.name)
    parser.add_argument(
        "--target",
        "--target-accuracy",
        type=float,
        default=None,
        help="the validation metric that ends an eval run or a tune episode [the workload's]",
    )
    parser.add_argument("--time-budget-s", type=float, default=None, help="[the workload's]")
    parser.add_argument("--eval-every-samples", type=int, default=None, help="[the workload's]")
    args = parser.parse_args(argv)
    if args.mode == "tune" and not args.stop_file:
        parser.error("tune needs --stop-file")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    Path(args.out_dir, f"rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
