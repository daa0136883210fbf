"""PyTorch integration: apply a new batch size (rebuilding the data loader, scaling the
learning rate) and a new synchronization period (DDP ``no_sync`` for the local micro-steps)
live, at a step boundary, on every rank at the same step.

Rank 0's agent receives released configs in the background. At each step boundary (every
``check_every`` steps) rank 0 broadcasts the version it has (one int64); when it is new, it
broadcasts the config too and every rank applies it before the step starts, so all ranks run
each config from the same step. Rank 0 then acknowledges it with that step.

::

    training = TunedTraining(agent, ddp_model, optimizer, make_loader,
                             config={"batch_size": 32, "sync_period": 1},
                             lr_scaling="sqrt", base_lr=0.05, base_batch=64)
    for step in range(steps):
        training.boundary(step)
        with training.step(step) as timed:
            for x, y in training.micro_batches(timed):
                with timed.phase("forward"):
                    loss = loss_fn(ddp_model(x), y) / training.sync_period
                with timed.phase("backward"):
                    loss.backward()
            timed.grad_norm = torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), 1.0)
            with timed.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
        if step % 1000 == 0:
            with training.agent.checkpoint():
                torch.save(ddp_model.state_dict(), "checkpoint.pt")

Each step reports its samples (``batch_size x sync_period``; tokens too with
``tokens_per_sample``), the learning rate, and the gradient norm: the one set on the step, or on
the steps that measure the noise scale, the norm of the averaged gradient.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, SupportsFloat

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import GradBucket  # what dist.GradBucket is
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from tuneloop.agent.agent import Agent
from tuneloop.agent.client import RankInfo
from tuneloop.agent.knobs import BUCKET_MB, GRAD_COMPRESSION, Knob, KnobError, check_unique
from tuneloop.agent.power import PowerLimitRefused
from tuneloop.agent.torch_loader import LoaderSettings as LoaderSettings
from tuneloop.learning_rate import (
    LR_SCALINGS,
    SYNC_MODES,
    LrScaling,
    SyncMode,
    lr_batch,
    scaled_lr,
)

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A released config the job cannot run (it is not applied, on any rank)."""


@dataclass
class _NoiseState:
    """Shared with the DDP communication hook: squared gradient norms of one update, and
    whether gradients travel compressed (the ``grad_compression`` knob)."""

    world: int
    active: bool = False
    local_sq: float = 0.0
    global_sq: float = 0.0
    compress: bool = False


def _noise_hook(state: _NoiseState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce (mean) a gradient bucket as DDP does (in fp16 with compression on:
    ``fp16_compress_hook``), recording this rank's local squared norm before and the averaged
    one after, when the step measures the noise scale."""
    buffer: torch.Tensor = bucket.buffer()
    if state.active:
        state.local_sq += float(buffer.pow(2).sum())
    if state.compress:
        future: torch.futures.Future[Any] = default_hooks.fp16_compress_hook(
            None,  # type: ignore[arg-type]  # None: the default group, as DDP passes it
            bucket,
        )
    else:
        work = dist.all_reduce(buffer, async_op=True)
        assert work is not None
        future = work.get_future()

    def averaged(done: torch.futures.Future[Any]) -> torch.Tensor:
        value = done.value()
        # The compression hook hands back the averaged buffer; all_reduce a list of sums.
        result: torch.Tensor = value if state.compress else value[0].div_(state.world)
        if state.active:
            state.global_sq += float(result.pow(2).sum())
        return result

    chained: torch.futures.Future[torch.Tensor] = future.then(averaged)
    return chained


# DDP compares the annotations with the classes themselves; postponed annotations are strings.
_noise_hook.__annotations__["bucket"] = GradBucket
_noise_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def gpu_uuid() -> list[str]:
    """The UUID of this process's current CUDA device, as nvidia-smi prints it (none on CPU)."""
    if not torch.cuda.is_available():
        return []
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = str(getattr(props, "uuid", "") or "")
    if not uuid:
        return []
    return [uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"]


class TunedTraining:
    """One rank's view of a training loop whose batch size and sync period tuneloop sets."""

    def __init__(
        self,
        agent: Agent,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        make_loader: Callable[[int], Iterable[Any]],
        *,
        config: Mapping[str, Any],
        lr_scaling: LrScaling | None = "linear",
        base_lr: float | None = None,
        base_batch: int | None = None,
        sync_mode: SyncMode = "accumulate",
        check_every: int = 1,
        noise_every: int = 10,
        tokens_per_sample: int | None = None,
        group: Any = None,
        knobs: Sequence[Knob] = (),
        bucket_mb: tuple[int, int] | None = None,
        grad_compression: bool | None = None,
    ) -> None:
        """``make_loader(batch_size)`` returns this rank's batches (re-created for a new batch
        size, and at the end of each pass). ``config`` is the starting one: ``batch_size``
        (per rank), ``sync_period`` (micro-batches per optimizer step, default 1) and
        optionally ``learning_rate``. Without ``learning_rate`` in a config the rate follows
        ``lr_scaling`` from ``base_lr`` at the global batch ``base_batch``, the rule the tuner
        applies (:mod:`tuneloop.learning_rate`); ``sync_mode`` is the study's: what one
        optimizer step sees with ``sync_period`` > 1 (``"local_sgd"`` when the loop steps the
        optimizer on every micro-batch and averages the models after ``sync_period``).
        ``noise_every``: measure the gradient noise scale every this many steps (0: never).
        ``tokens_per_sample``: a sample's tokens (the sequence length), to report tokens.

        ``knobs``: the job's own settings a study may search (:mod:`tuneloop.agent.knobs`,
        e.g. :meth:`tuneloop.agent.torch_loader.LoaderSettings.knobs`), declared when the agent
        registers and applied here at a step boundary. Two DDP knobs are built in:
        ``bucket_mb=(low, high)`` declares ``bucket_mb`` (the all-reduce bucket size; a new
        value re-wraps the module in a new ``DistributedDataParallel`` on every rank at the
        step boundary, so use :attr:`model`, not the wrapper you passed, in the step) and
        ``grad_compression=False`` (or ``True``: the starting value) declares
        ``grad_compression`` (gradients all-reduced in fp16, ``fp16_compress_hook``)."""
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        if lr_scaling is not None and lr_scaling not in LR_SCALINGS:
            raise ValueError(f"lr_scaling must be linear, sqrt or None, got {lr_scaling!r}")
        if sync_mode not in SYNC_MODES:
            raise ValueError(f"sync_mode must be accumulate or local_sgd, got {sync_mode!r}")
        self.agent = agent
        self.model = model
        self.optimizer = optimizer
        self._make_loader = make_loader
        self._lr_scaling = lr_scaling
        self._base_lr = base_lr
        self._base_batch = base_batch
        self._sync_mode = sync_mode
        self._check_every = check_every
        self._noise_every = noise_every
        self._tokens_per_sample = tokens_per_sample
        self._group = group
        self._distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self._distributed else 0
        self.world_size = dist.get_world_size(group) if self._distributed else 1
        self.history: list[tuple[int, int]] = []
        """(version, step) of every config applied, in order."""
        self.config: dict[str, Any] = {}
        self.batch_size = 0
        self.sync_period = 1
        self.version = 0
        ddp = isinstance(model, DistributedDataParallel) and self.world_size > 1
        self._noise: _NoiseState | None = None
        if ddp and (noise_every > 0 or grad_compression is not None):
            assert isinstance(model, DistributedDataParallel)
            self._noise = _NoiseState(world=self.world_size, compress=bool(grad_compression))
            model.register_comm_hook(self._noise, _noise_hook)
        self._knobs = check_unique([*knobs, *self._ddp_knobs(ddp, bucket_mb, grad_compression)])
        self.knob_values: dict[str, Any] = {k.name: k.default for k in self._knobs.values()}
        """The value each knob runs with now."""
        self._apply({**self.knob_values, **dict(config)})
        self._start_agent()

    # ------------------------------------------------------------------ config

    def _ddp_knobs(
        self, ddp: bool, bucket_mb: tuple[int, int] | None, compression: bool | None
    ) -> list[Knob]:
        if not ddp and (bucket_mb is not None or compression is not None):
            raise ValueError("bucket_mb and grad_compression need a multi-rank DDP model")
        knobs = []
        if bucket_mb is not None:
            assert isinstance(self.model, DistributedDataParallel)
            # DDP keeps its bucket cap in bytes; the knob speaks MB, as bucket_cap_mb does.
            current = round(self.model.bucket_bytes_cap / (1024 * 1024))
            knobs.append(
                Knob.integer(BUCKET_MB, *bucket_mb, default=current, apply=self._rewrap, log=True)
            )
        if compression is not None:
            knobs.append(
                Knob.choice(
                    GRAD_COMPRESSION, (False, True), default=compression, apply=self._compress
                )
            )
        return knobs

    def _compress(self, on: bool) -> None:
        assert self._noise is not None
        self._noise.compress = on

    def _rewrap(self, bucket_mb: int) -> None:
        """A new DDP wrapper with ``bucket_mb``: collective (every rank builds it at the same
        step boundary, when no gradient is in flight and no ``no_sync`` is open); the module,
        its parameters and so the optimizer stay the same."""
        old = self.model
        assert isinstance(old, DistributedDataParallel)
        self.model = DistributedDataParallel(
            old.module,
            device_ids=old.device_ids,
            output_device=old.output_device,
            broadcast_buffers=old.broadcast_buffers,
            process_group=old.process_group,
            bucket_cap_mb=bucket_mb,
            find_unused_parameters=old.find_unused_parameters,
            gradient_as_bucket_view=old.gradient_as_bucket_view,
        )
        if self._noise is not None:
            self.model.register_comm_hook(self._noise, _noise_hook)

    def _start_agent(self) -> None:
        place = (gpu_uuid(), socket.gethostname())
        if self._distributed:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, place, group=self._group)
        else:
            gathered = [place]
        ranks = [RankInfo(rank, tuple(u), host) for rank, (u, host) in enumerate(gathered)]
        self.agent.start(
            self.config,
            ranks,
            details={"framework": f"torch {torch.__version__}"},
            knobs=list(self._knobs.values()),
        )

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _lr_for(self, config: Mapping[str, Any], batch: int, period: int) -> float | None:
        if "learning_rate" in config:
            return float(config["learning_rate"])
        if self._lr_scaling is None or self._base_lr is None or self._base_batch is None:
            return None
        batch_seen = lr_batch(batch, self.world_size, period, self._sync_mode)
        return scaled_lr(self._lr_scaling, self._base_lr, self._base_batch, batch_seen)

    @staticmethod
    def _check(config: Mapping[str, Any]) -> tuple[int, int]:
        batch, period = config.get("batch_size"), config.get("sync_period", 1)
        for name, value in (("batch_size", batch), ("sync_period", period)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        lr = config.get("learning_rate")
        if lr is not None and (not isinstance(lr, int | float) or not lr > 0):
            raise ConfigError(f"learning_rate must be a positive number, got {lr!r}")
        assert isinstance(batch, int) and isinstance(period, int)
        return batch, period

    def _changed_knobs(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The knobs ``config`` changes, each value checked: all or nothing is applied."""
        changed = {}
        for name, knob in self._knobs.items():
            if name not in config:
                continue  # a config from before the knob was declared: keep its value
            try:
                value = knob.check(config[name])
            except KnobError as exc:
                raise ConfigError(str(exc)) from None
            now = self.knob_values[name]
            if type(value) is not type(now) or value != now:
                changed[name] = value
        return changed

    def _apply(self, config: dict[str, Any]) -> None:
        batch, period = self._check(config)
        knobs = self._changed_knobs(config)
        lr = self._lr_for(config, batch, period)
        for name, value in knobs.items():
            self._knobs[name].apply(value)
            self.knob_values[name] = value
        reload = any(self._knobs[name].reload for name in knobs)
        if batch != self.batch_size or reload:
            self._batches: Iterator[Any] = iter(())
            self._loader = self._make_loader(batch)  # the old loader's workers are let go
            self._batches = iter(self._loader)
        self.batch_size, self.sync_period = batch, period
        self.config = {**config, **self.knob_values}
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr

    def boundary(self, step: int) -> bool:
        """Call before each step on every rank: applies a newly released config (on every
        rank, from this step). Returns whether one was applied."""
        if step % self._check_every:
            return False
        pending = self.agent.pending() if self.rank == 0 else None
        version = pending.version if pending is not None else 0
        config: dict[str, Any] | None = dict(pending.config) if pending is not None else None
        if self._distributed:
            flag = torch.tensor([version], dtype=torch.int64)
            dist.broadcast(flag, src=0, group=self._group)
            version = int(flag.item())
            if version <= 0:
                return False
            box: list[Any] = [config]
            dist.broadcast_object_list(box, src=0, group=self._group)
            config = box[0]
        if version <= 0 or config is None:
            return False
        try:
            self._apply(dict(config))
        except ConfigError as exc:
            # The same config reached every rank, so every rank refuses it at the same step.
            log.error("released version %d not applied: %s", version, exc)
            if self.rank == 0:
                self.agent.refuse(version, str(exc))
            return False
        if self.rank != 0:
            # Rank 0's agent set its GPUs' power limit before releasing the config to the ranks.
            try:
                self.agent.apply_power(config)
            except PowerLimitRefused as exc:
                log.error(
                    "rank %d: version %d runs without its power limit: %s", self.rank, version, exc
                )
        self.version = version
        self.history.append((version, step))
        if self.rank == 0:
            self.agent.applied(version, config, step)
        log.info("rank %d runs version %d from step %d: %s", self.rank, version, step, config)
        return True

    # ------------------------------------------------------------------ the step

    def next_batch(self) -> Any:
        """The next batch of the current loader, starting a new pass when one ends."""
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = iter(self._loader)
            return next(self._batches)

    def step(self, number: int) -> TrainingStep:
        """Time step ``number`` (``batch_size x sync_period`` samples on this rank)."""
        measure = self._noise is not None and self._noise_every > 0
        measure = measure and number % self._noise_every == 0
        return TrainingStep(self, number, measure)

    def micro_batches(self, timed: TrainingStep | None = None) -> Iterator[Any]:
        """The step's ``sync_period`` micro-batches; all but the last run under DDP's
        ``no_sync`` (gradients accumulate locally), the last one's backward all-reduces."""
        ddp = self.model if isinstance(self.model, DistributedDataParallel) else None
        for micro in range(self.sync_period):
            if timed is not None:
                with timed.phase("data_loading"):
                    batch = self.next_batch()
            else:
                batch = self.next_batch()
            last = micro == self.sync_period - 1
            context = ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext()
            with context:
                yield batch


class TrainingStep:
    """The step span of one step, and the noise-scale bookkeeping around it."""

    def __init__(self, training: TunedTraining, number: int, measure_noise: bool) -> None:
        self._training = training
        self._number = number
        self._measure = measure_noise
        self._span: Any = None
        self.grad_norm: SupportsFloat | None = None
        """Set it to the step's gradient norm (a tensor is fine: it is read off the step)."""

    def __enter__(self) -> TrainingStep:
        t = self._training
        samples = t.batch_size * t.sync_period
        per = t._tokens_per_sample
        self._span = t.agent.step(
            self._number, samples=samples, tokens=None if per is None else samples * per
        )
        self._span.__enter__()
        noise = t._noise
        if noise is not None:
            noise.active = self._measure
            noise.local_sq = noise.global_sq = 0.0
        return self

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        phase = getattr(self._span, "phase", None)
        return phase(name) if phase is not None else contextlib.nullcontext()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._span.__exit__(exc_type, exc, traceback)
        t = self._training
        noise = t._noise
        grad_norm = self.grad_norm
        if noise is not None and noise.active and exc is None and noise.global_sq > 0:
            b_small = t.batch_size * t.sync_period
            # This rank's local gradient is as good a sample of |G_small|^2 as any rank's.
            t.agent.record_noise(noise.local_sq, noise.global_sq, b_small, b_small * t.world_size)
            if grad_norm is None:
                grad_norm = math.sqrt(noise.global_sq)  # the averaged gradient's norm
        if noise is not None:
            noise.active = False
        if exc is None:
            t.agent.record(grad_norm=grad_norm, learning_rate=t.learning_rate)
