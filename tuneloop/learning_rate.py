"""The learning-rate rule: how the learning rate follows the batch one optimizer step sees.

One rule for both sides of a change: the tuner writes the learning rate that goes with each
proposal (:meth:`tuner.space.SearchSpace.apply_lr_rule`) and the job's agent computes it for
a released config that carries none (:class:`tuneloop.agent.torch.TunedTraining`). Pure
Python with no dependencies, because it ships with the agent into training jobs.
"""

from __future__ import annotations

import math
from typing import Literal, TypeAlias

LrScaling: TypeAlias = Literal["linear", "sqrt"]
SyncMode: TypeAlias = Literal["accumulate", "local_sgd"]

LR_SCALINGS: tuple[LrScaling, ...] = ("linear", "sqrt")
SYNC_MODES: tuple[SyncMode, ...] = ("accumulate", "local_sgd")


def lr_batch(batch_size: int, ranks: int, sync_period: int, sync_mode: SyncMode) -> int:
    """The batch one optimizer step sees, which is what the learning rate scales with.

    ``accumulate``: gradients of ``sync_period`` micro-batches are summed into one step, so
    the step sees ``batch_size * ranks * sync_period`` samples. ``local_sgd``: each of the
    ``sync_period`` local steps sees ``batch_size`` samples per rank and the models are
    averaged afterwards; as in Lin et al. (ICLR 2020) the learning rate scales with the
    synchronous batch ``batch_size * ranks`` and the period does not change it.
    """
    if sync_mode not in SYNC_MODES:
        raise ValueError(f"unknown sync_mode {sync_mode!r} (accumulate, local_sgd)")
    batch = batch_size * ranks
    return batch * sync_period if sync_mode == "accumulate" else batch


def scaled_lr(scaling: LrScaling, base_lr: float, base_batch: int, batch: int) -> float:
    """``base_lr * B/B0`` (linear: SGD, Goyal et al.) or ``base_lr * sqrt(B/B0)`` (sqrt:
    Adam-style optimizers), with ``B = batch`` and ``B0 = base_batch``, the global batch
    ``base_lr`` was tuned at."""
    if scaling not in LR_SCALINGS:
        raise ValueError(f"unknown lr_scaling {scaling!r} (linear, sqrt)")
    ratio = batch / base_batch
    return base_lr * ratio if scaling == "linear" else base_lr * math.sqrt(ratio)
