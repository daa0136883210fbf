"""A real 2-process DistributedDataParallel training job on the CPU, instrumented for tuning.

What runs
---------
Two processes (``torch.multiprocessing.spawn``, gloo backend, ``MASTER_ADDR=127.0.0.1`` and a
free port, one intra-op thread each) train a small CNN on scikit-learn's bundled
``load_digits`` (1,797 8x8 grey-scale digits, 10 classes; no download). The images are scaled to
[0, 1] and standardized with the training set's mean and standard deviation; a fixed split
(seed 0) holds out 360 images for validation and leaves 1,437 for training.

Model (``nn.Sequential``, 151,306 parameters, 0.6 MB of fp32 gradients per sync)::

    Conv2d(1, 32, 3, pad 1) -> ReLU -> Conv2d(32, 64, 3, pad 1) -> ReLU -> MaxPool2d(2)
    -> Flatten -> Linear(1024, 128) -> ReLU -> Linear(128, 10)

Knobs of one run (:class:`RunSpec`)
-----------------------------------
* ``batch``: per-rank micro-batch ``b``.
* ``sync_period``: ``k``, gradient accumulation: ``k - 1`` micro-steps under DDP's ``no_sync()``
  (gradients accumulate locally, no communication), then one micro-step whose backward
  all-reduces the accumulated gradients, then one SGD update. The loss of a micro-step is divided
  by ``k``, so an update applies the mean gradient of ``M = world x b x k`` samples (the
  *effective batch*): a larger ``b`` or ``k`` means fewer, larger updates per epoch, which is the
  real statistical cost of large batches.
* learning-rate scaling: ``lr = base_lr x (M / base_batch) ** p``, ``p = 0.5`` (``"sqrt"``) or
  ``1`` (``"linear"``); SGD with momentum 0.9.

Each rank draws its micro-batches from its own half of each epoch's permutation of the training
set (like ``DistributedSampler``; epochs are re-shuffled with the run's seed, batches run on
across epoch boundaries). The run's seed also sets the model's initial weights.

What is measured
----------------
* **Phases** of every micro-step on rank 0: data (index gather), forward, backward (minus the
  all-reduce; it includes the two squared norms the hook computes), sync (the synchronous
  all-reduce inside DDP's communication hook, which also absorbs waiting for the slower rank,
  plus the emulated network delay if any) and optimizer (``step`` + ``zero_grad``), summed per
  update.
* **Throughput**: global samples per second of training time after ``warmup_updates`` updates.
* **Validation accuracy over time**: every ``eval_every_samples`` global samples (at an update
  boundary) both ranks evaluate half the validation set each and all-reduce the counts. The
  training clock is paused during evaluation: **time to target** is the training time (data +
  forward + backward + sync + optimizer, as measured by rank 0's clock) at the first evaluation
  whose accuracy is ``>= target_accuracy``. A run stops there, or as ``not_reached`` once its
  training time passes ``time_budget_s`` (checked at evaluations), or as ``diverged`` when the
  validation loss is not finite.
* **Gradient noise scale** (McCandlish et al. 2018, "An Empirical Model of Large-Batch
  Training", appendix A): DDP's communication hook sees each rank's local accumulated gradient
  ``G_small`` (mean over ``B_small = b x k`` samples) before the all-reduce and the averaged
  gradient ``G_big`` (``B_big = world x b x k``) after it. Over the updates of an interval

      |G|^2   ~= (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
      tr(S)   ~= (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

  are unbiased; ``B_simple = tr(S) / |G|^2`` is formed from their sums (means before the
  ratio, as the paper recommends). ``|G_small|^2`` is the mean of both ranks' values.

Emulations (documented, not hidden)
-----------------------------------
* **Slower interconnect** (``net_bandwidth_mb_s``, ``net_latency_ms``): after the real
  all-reduce the hook sleeps ``2 (W - 1) / W x bytes / bandwidth`` (ring all-reduce traffic of
  the bucket), and the synchronizing micro-step then sleeps ``latency`` once per update, both
  counted as sync time: network contention emulated on a single host.
* **GPU memory limit** (``memory_budget_mib``): this machine has no GPU, so the job estimates the
  per-rank activation memory as ``b x`` (elements output by every leaf module for one sample)
  ``x 4`` bytes, and when it exceeds the budget raises :class:`EmulatedOutOfMemoryError` before
  the first forward pass (the run is recorded as ``oom``: infeasible). With gradient
  accumulation only the micro-batch ``b`` counts, as on a GPU.

Run one configuration by hand (prints the run's JSON; ``bench.training.measure`` runs grids,
with a throw-away warm-up run first: the first DDP construction in a process group takes
seconds, which ``setup_s`` records and the training clock excludes)::

    .venv/bin/python -m bench.training.ddp_job --batch 64 --sync-period 2 --seed 0
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# torch and scikit-learn are the `demo` extra, which CI does not install: the ignores keep
# `mypy --strict` clean with and without them (torch ships types, scikit-learn does not).
import torch  # type: ignore[import-not-found, unused-ignore]
import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]
from sklearn.datasets import load_digits  # type: ignore[import-untyped, import-not-found, unused-ignore]
from torch import nn  # type: ignore[import-not-found, unused-ignore]
from torch._C._distributed_c10d import (  # type: ignore[import-not-found, unused-ignore]
    GradBucket,  # is torch.distributed.GradBucket, which DDP wants as the annotation
)
from torch.multiprocessing.spawn import spawn  # type: ignore[import-not-found, unused-ignore]
from torch.nn.parallel import (  # type: ignore[import-not-found, unused-ignore]
    DistributedDataParallel,
)

from tuneloop.ports import free_port

WORLD_SIZE = 2
VALIDATION_SIZE = 360
SPLIT_SEED = 0
BYTES_PER_ELEMENT = 4  # fp32


class EmulatedOutOfMemoryError(RuntimeError):
    """The emulated GPU memory limit: the micro-batch's activations do not fit the budget."""


@dataclass(frozen=True)
class RunSpec:
    """One training run: a configuration, a seed and the condition it runs under."""

    batch: int
    sync_period: int
    seed: int
    condition: str = "baseline"
    lr_rule: str = "sqrt"
    base_lr: float = 0.05
    base_batch: int = 32
    momentum: float = 0.9
    target_accuracy: float = 0.98
    time_budget_s: float = 10.0
    eval_every_samples: int = 512
    warmup_updates: int = 3
    net_bandwidth_mb_s: float | None = None
    net_latency_ms: float = 0.0
    memory_budget_mib: float | None = None

    @property
    def effective_batch(self) -> int:
        """Samples whose mean gradient one update applies: ``world x b x k``."""
        return WORLD_SIZE * self.batch * self.sync_period

    @property
    def lr(self) -> float:
        """The learning rate after the scaling rule."""
        power = {"sqrt": 0.5, "linear": 1.0}[self.lr_rule]
        return self.base_lr * math.pow(self.effective_batch / self.base_batch, power)

    def key(self) -> tuple[str, int, int, int]:
        """Identifies the run within a measurement: condition, batch, sync period, seed."""
        return (self.condition, self.batch, self.sync_period, self.seed)


@dataclass
class _Data:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


def load_data() -> _Data:
    """scikit-learn's digits, scaled and standardized, split 1,437 train / 360 validation."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = order[:VALIDATION_SIZE], order[VALIDATION_SIZE:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return _Data(x[train], y[train], x[val], y[val])


def build_model() -> nn.Module:
    """The small CNN described in the module docstring."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def activation_elements_per_sample(model: nn.Module) -> int:
    """Elements output by every leaf module for one sample (what backward keeps alive)."""
    total = 0

    def count(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        nonlocal total
        total += int(output.numel())

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 1, 8, 8))
    finally:
        for handle in handles:
            handle.remove()
    return total


def activation_bytes(model: nn.Module, batch: int) -> int:
    """Estimated per-rank activation memory of a micro-batch of ``batch`` samples."""
    return batch * activation_elements_per_sample(model) * BYTES_PER_ELEMENT


def check_memory_budget(spec: RunSpec, act_bytes: int) -> None:
    """Raise :class:`EmulatedOutOfMemoryError` when the activations exceed the budget."""
    if spec.memory_budget_mib is not None and act_bytes > spec.memory_budget_mib * 2**20:
        raise EmulatedOutOfMemoryError(
            f"emulated CUDA out of memory: a micro-batch of {spec.batch} needs "
            f"{act_bytes / 2**20:.2f} MiB of activations per rank, over the "
            f"{spec.memory_budget_mib:g} MiB budget"
        )


class _ShardStream:
    """This rank's micro-batches: its half of each epoch's permutation, across epochs."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, rank: int, world: int, seed: int):
        self._x, self._y = x, y
        self._rank, self._world, self._seed = rank, world, seed
        self._epoch = -1
        self._order = torch.empty(0, dtype=torch.int64)
        self._pos = 0

    def _next_epoch(self) -> None:
        self._epoch += 1
        generator = torch.Generator().manual_seed(self._seed * 100_003 + self._epoch)
        perm = torch.randperm(len(self._y), generator=generator)
        self._order = perm[self._rank :: self._world]
        self._pos = 0

    def next(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts: list[torch.Tensor] = []
        need = size
        while need > 0:
            if self._pos >= len(self._order):
                self._next_epoch()
            take = self._order[self._pos : self._pos + need]
            self._pos += len(take)
            need -= len(take)
            parts.append(take)
        index = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self._x[index], self._y[index]


@dataclass
class _SyncState:
    """Shared with DDP's communication hook: gradient norms and sync time of one update."""

    world: int
    delay_s: float
    local_sq: float = 0.0
    global_sq: float = 0.0
    sync_s: float = 0.0


def _instrumented_allreduce(
    state: _SyncState, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: all-reduce (mean) a bucket, recording both squared norms.

    The all-reduce is synchronous (gloo on one host overlaps little with backward anyway) so
    that its time, and the emulated network delay, are attributable to the sync phase.
    """
    buffer = bucket.buffer()
    state.local_sq += float(buffer.pow(2).sum())
    start = time.perf_counter()
    dist.all_reduce(buffer)
    if state.delay_s > 0:
        time.sleep(state.delay_s * buffer.numel() * buffer.element_size())
    state.sync_s += time.perf_counter() - start
    buffer.div_(state.world)
    state.global_sq += float(buffer.pow(2).sum())
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


@dataclass
class _Phases:
    data: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    sync: float = 0.0
    optimizer: float = 0.0

    def total(self) -> float:
        return self.data + self.forward + self.backward + self.sync + self.optimizer


@dataclass
class RunResult:
    """Everything measured in one run (rank 0's clock; counts are global)."""

    spec: dict[str, Any]
    status: str  # reached | not_reached | diverged | oom
    effective_batch: int
    lr: float
    activation_bytes_per_rank: int
    error: str | None = None
    time_to_target_s: float | None = None
    samples_to_target: int | None = None
    updates_to_target: int | None = None
    train_time_s: float = 0.0
    eval_time_s: float = 0.0
    wall_time_s: float = 0.0
    setup_s: float = 0.0  # model, DDP wrapper and optimizer construction
    samples: int = 0
    updates: int = 0
    throughput: float | None = None  # samples/s after warm-up
    throughput_all: float | None = None  # samples/s including warm-up
    step_time_s: float | None = None  # mean per update after warm-up
    phases_s: dict[str, float] = field(default_factory=dict)  # mean per update after warm-up
    grad_sq_small: float | None = None  # mean |G_small|^2 over updates
    grad_sq_big: float | None = None  # mean |G_big|^2 over updates
    grad_sq_est: float | None = None  # unbiased |G|^2
    trace_sigma_est: float | None = None  # unbiased tr(Sigma)
    noise_scale: float | None = None  # B_simple over the whole run
    final_accuracy: float | None = None
    best_accuracy: float | None = None
    history: list[dict[str, float | None]] = field(default_factory=list)
    loadavg_1m: float = 0.0


def noise_estimates(
    sq_small: float, sq_big: float, b_small: int, b_big: int
) -> tuple[float, float, float | None]:
    """Unbiased ``|G|^2``, ``tr(Sigma)`` and ``B_simple`` from two batch sizes' squared norms."""
    grad_sq = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return grad_sq, trace, (trace / grad_sq if grad_sq > 0 else None)


def _evaluate(model: nn.Module, data: _Data, rank: int, world: int) -> tuple[float, float]:
    """This rank's share of the validation set: (correct, summed loss)."""
    x, y = data.x_val[rank::world], data.y_val[rank::world]
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y, reduction="sum")
        correct = (logits.argmax(dim=1) == y).sum()
    return float(correct), float(loss)


def run_one(spec: RunSpec, data: _Data, rank: int, world: int) -> RunResult:
    """Train one configuration until the target, the time budget or divergence.

    Must be called by every rank of the (gloo) process group with the same ``spec``.
    """
    wall_start = time.perf_counter()
    torch.manual_seed(spec.seed)
    model = build_model()
    act_bytes = activation_bytes(model, spec.batch)
    result = RunResult(
        spec=asdict(spec),
        status="not_reached",
        effective_batch=spec.effective_batch,
        lr=spec.lr,
        activation_bytes_per_rank=act_bytes,
        loadavg_1m=os.getloadavg()[0],
    )
    try:
        check_memory_budget(spec, act_bytes)
    except EmulatedOutOfMemoryError as error:
        # Deterministic on both ranks, so no collective is left waiting.
        result.status = "oom"
        result.error = str(error)
        return result

    ddp = DistributedDataParallel(model)
    delay_s = 0.0
    if spec.net_bandwidth_mb_s:
        delay_s = 2 * (world - 1) / world / (spec.net_bandwidth_mb_s * 1e6)
    state = _SyncState(world=world, delay_s=delay_s)
    ddp.register_comm_hook(state, _instrumented_allreduce)
    latency_s = spec.net_latency_ms / 1000.0
    optimizer = torch.optim.SGD(ddp.parameters(), lr=spec.lr, momentum=spec.momentum)
    stream = _ShardStream(data.x_train, data.y_train, rank, world, spec.seed)
    b_small, b_big = spec.batch * spec.sync_period, spec.effective_batch

    train_time = eval_time = 0.0
    samples = updates = 0
    steady_time = 0.0
    steady_samples = 0
    steady = _Phases()
    sq_small_total = sq_big_total = 0.0
    interval_small = interval_big = 0.0
    interval_updates = 0
    last_eval_samples = 0
    clock = time.perf_counter
    result.setup_s = clock() - wall_start

    while True:
        phases = _Phases()
        state.local_sq = state.global_sq = state.sync_s = 0.0
        for micro in range(spec.sync_period):
            t0 = clock()
            x, y = stream.next(spec.batch)
            t1 = clock()
            sync_now = micro == spec.sync_period - 1
            context = contextlib.nullcontext() if sync_now else ddp.no_sync()
            with context:
                loss = nn.functional.cross_entropy(ddp(x), y) / spec.sync_period
                t2 = clock()
                sync_before = state.sync_s
                torch.autograd.backward(loss)
                t3 = clock()
            if sync_now and latency_s > 0:
                time.sleep(latency_s)
                state.sync_s += clock() - t3
                t3 = clock()
            phases.data += t1 - t0
            phases.forward += t2 - t1
            phases.backward += (t3 - t2) - (state.sync_s - sync_before)
        phases.sync = state.sync_s
        t4 = clock()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phases.optimizer = clock() - t4

        step = phases.total()
        train_time += step
        samples += b_big
        updates += 1
        if updates > spec.warmup_updates:
            steady_time += step
            steady_samples += b_big
            for name in ("data", "forward", "backward", "sync", "optimizer"):
                setattr(steady, name, getattr(steady, name) + getattr(phases, name))
        interval_small += state.local_sq
        interval_big += state.global_sq
        interval_updates += 1

        if samples - last_eval_samples < spec.eval_every_samples:
            continue
        last_eval_samples = samples
        t5 = clock()
        correct, loss_sum = _evaluate(ddp.module, data, rank, world)
        over_budget = 1.0 if train_time >= spec.time_budget_s else 0.0
        summary = torch.tensor(
            [correct, loss_sum, over_budget, interval_small], dtype=torch.float64
        )
        dist.all_reduce(summary)
        eval_time += clock() - t5
        accuracy = float(summary[0]) / len(data.y_val)
        val_loss = float(summary[1]) / len(data.y_val)
        sq_small = float(summary[3]) / world / interval_updates
        sq_big = interval_big / interval_updates
        sq_small_total += sq_small * interval_updates
        sq_big_total += sq_big * interval_updates
        _, _, interval_noise = noise_estimates(sq_small, sq_big, b_small, b_big)
        result.history.append(
            {
                "train_time_s": train_time,
                "samples": samples,
                "updates": updates,
                "accuracy": accuracy,
                "val_loss": val_loss,
                "grad_sq_small": sq_small,
                "grad_sq_big": sq_big,
                "interval_updates": interval_updates,
                "noise_scale": interval_noise,
            }
        )
        interval_small = interval_big = 0.0
        interval_updates = 0
        result.final_accuracy = accuracy
        result.best_accuracy = max(accuracy, result.best_accuracy or 0.0)
        if not math.isfinite(val_loss):
            result.status = "diverged"
            break
        if accuracy >= spec.target_accuracy:
            result.status = "reached"
            result.time_to_target_s = train_time
            result.samples_to_target = samples
            result.updates_to_target = updates
            break
        if float(summary[2]) > 0:
            break

    result.train_time_s = train_time
    result.eval_time_s = eval_time
    result.samples = samples
    result.updates = updates
    result.throughput_all = samples / train_time if train_time > 0 else None
    n_steady = updates - spec.warmup_updates
    if n_steady > 0 and steady_time > 0:
        result.throughput = steady_samples / steady_time
        result.step_time_s = steady_time / n_steady
        result.phases_s = {k: v / n_steady for k, v in asdict(steady).items()}
    counted = updates - interval_updates  # updates folded into an evaluation's statistics
    if counted > 0:
        result.grad_sq_small = sq_small_total / counted
        result.grad_sq_big = sq_big_total / counted
        grad_sq, trace, noise = noise_estimates(
            result.grad_sq_small, result.grad_sq_big, b_small, b_big
        )
        result.grad_sq_est, result.trace_sigma_est, result.noise_scale = grad_sq, trace, noise
    result.wall_time_s = time.perf_counter() - wall_start
    return result


def _worker(
    rank: int, world: int, port: int, specs: Sequence[RunSpec], out_path: str | None
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        data = load_data()
        started = time.perf_counter()
        for index, spec in enumerate(specs):
            dist.barrier()
            result = run_one(spec, data, rank, world)
            if rank != 0:
                continue
            line = json.dumps(asdict(result))
            if out_path is None:
                print(line, flush=True)
            else:
                with open(out_path, "a", encoding="utf-8") as out:
                    out.write(line + "\n")
            elapsed = time.perf_counter() - started
            eta = elapsed / (index + 1) * (len(specs) - index - 1)
            progress = _progress_line(index + 1, len(specs), result)
            print(f"{progress} [{elapsed / 60:.1f} min, eta {eta / 60:.1f} min]", file=sys.stderr)
    finally:
        dist.destroy_process_group()


def _progress_line(done: int, total: int, result: RunResult) -> str:
    spec = result.spec
    ttt = f"{result.time_to_target_s:6.2f}s" if result.time_to_target_s is not None else "   --  "
    thr = f"{result.throughput:8.0f}/s" if result.throughput is not None else "     --  "
    noise = f"{result.noise_scale:7.0f}" if result.noise_scale is not None else "    -- "
    return (
        f"[{done:4d}/{total}] {spec['condition']:<9} b={spec['batch']:<4d} "
        f"k={spec['sync_period']:<2d} seed={spec['seed']} {result.status:<11} "
        f"ttt={ttt} thr={thr} B_noise={noise} acc={result.best_accuracy or 0:.3f} "
        f"wall={result.wall_time_s:5.1f}s load={result.loadavg_1m:.2f}"
    )


def run_specs(specs: Sequence[RunSpec], out_path: Path | None = None) -> None:
    """Spawn the 2-process group once and run ``specs`` in order, one JSON line per run.

    Lines are appended to ``out_path`` (stdout when None); progress goes to stderr.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = (WORLD_SIZE, free_port(), list(specs), None if out_path is None else str(out_path))
    start: Callable[..., Any] = spawn  # torch leaves spawn() unannotated
    start(_worker, args=args, nprocs=WORLD_SIZE, join=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Run one configuration and print its result as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    d = RunSpec(batch=64, sync_period=1, seed=0)  # the defaults measure.py also uses
    parser.add_argument("--batch", type=int, default=d.batch, help="per-rank micro-batch")
    parser.add_argument("--sync-period", type=int, default=d.sync_period, help="k")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--condition", default="manual", help="label recorded with the run")
    parser.add_argument("--lr-rule", choices=["sqrt", "linear"], default=d.lr_rule)
    parser.add_argument("--base-lr", type=float, default=d.base_lr)
    parser.add_argument("--base-batch", type=int, default=d.base_batch)
    parser.add_argument("--target", type=float, default=d.target_accuracy)
    parser.add_argument("--time-budget", type=float, default=d.time_budget_s)
    parser.add_argument("--net-bandwidth-mb-s", type=float, default=d.net_bandwidth_mb_s)
    parser.add_argument("--net-latency-ms", type=float, default=d.net_latency_ms)
    parser.add_argument("--memory-budget-mib", type=float, default=d.memory_budget_mib)
    ns = parser.parse_args(argv)
    spec = RunSpec(
        batch=ns.batch,
        sync_period=ns.sync_period,
        seed=ns.seed,
        condition=ns.condition,
        lr_rule=ns.lr_rule,
        base_lr=ns.base_lr,
        base_batch=ns.base_batch,
        target_accuracy=ns.target,
        time_budget_s=ns.time_budget,
        net_bandwidth_mb_s=ns.net_bandwidth_mb_s,
        net_latency_ms=ns.net_latency_ms,
        memory_budget_mib=ns.memory_budget_mib,
    )
    run_specs([spec])


if __name__ == "__main__":
    main()
