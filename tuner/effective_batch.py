"""The batch rules of the standard training parameters: the effective batch a configuration
means on some number of ranks, the batch its learning rate scales with, and the largest batch
that fits a device's memory."""

from __future__ import annotations

import math
from collections.abc import Mapping

from tuneloop.learning_rate import SyncMode
from tuneloop.learning_rate import lr_batch as rule_lr_batch
from tuner.params import SpaceError, is_int

# Names of the standard training parameters; the lr rule and the OOM rule look for these.
BATCH_SIZE = "batch_size"
SYNC_PERIOD = "sync_period"
BUCKET_MB = "bucket_mb"


def effective_batch(config: Mapping[str, object], ranks: int) -> int:
    """Samples per gradient synchronisation: ``batch_size * ranks * sync_period``.

    This is Pollux's M (``atomic_bsz * replicas * (accum_steps + 1)``) and what statistical
    efficiency is computed on, in both sync modes (for local SGD it is the conservative
    choice: averaging after k local steps is at least as statistically efficient as one step
    on a batch k times larger, so goodput is never overestimated).
    """
    _check_ranks(ranks)
    batch = _positive_int(config, BATCH_SIZE)
    return batch * ranks * _sync_period(config)


def lr_batch(config: Mapping[str, object], ranks: int, sync_mode: SyncMode) -> int:
    """The batch one optimizer step sees, which is what the learning rate scales with
    (:func:`tuneloop.learning_rate.lr_batch`: ``sync_mode`` decides whether
    ``sync_period`` counts)."""
    _check_ranks(ranks)
    batch = _positive_int(config, BATCH_SIZE)
    return rule_lr_batch(batch, ranks, _sync_period(config), sync_mode)


def max_batch_for_memory(
    memory_total_bytes: float,
    fixed_bytes: float,
    bytes_per_sample: float,
    headroom: float = 0.1,
) -> int:
    """Largest per-device batch whose estimated peak memory leaves ``headroom`` (a fraction of
    the device) free, with the linear model ``peak = fixed + bytes_per_sample * batch`` (weights,
    optimizer state and buffers are fixed; activations grow with the batch). Feed the result to
    :meth:`SearchSpace.limit`."""
    if not 0 <= headroom < 1:
        raise SpaceError(f"headroom must be in [0, 1), got {headroom}")
    if memory_total_bytes <= 0 or fixed_bytes < 0 or bytes_per_sample <= 0:
        raise SpaceError("memory sizes must be positive (fixed may be 0)")
    usable = memory_total_bytes * (1 - headroom) - fixed_bytes
    batch = math.floor(usable / bytes_per_sample)
    if batch < 1:
        raise SpaceError(
            f"no batch fits: {fixed_bytes:.3g} B fixed leaves {usable:.3g} B "
            f"for {bytes_per_sample:.3g} B per sample"
        )
    return batch


def _positive_int(config: Mapping[str, object], name: str) -> int:
    value = config.get(name)
    if not is_int(value) or int(value) < 1:
        raise SpaceError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _sync_period(config: Mapping[str, object]) -> int:
    return _positive_int(config, SYNC_PERIOD) if SYNC_PERIOD in config else 1


def _check_ranks(ranks: int) -> None:
    if not is_int(ranks) or ranks < 1:
        raise SpaceError(f"ranks must be a positive integer, got {ranks!r}")
