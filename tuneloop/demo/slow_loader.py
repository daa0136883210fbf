"""The demo job's input pipeline as a real ``torch.utils.data.DataLoader`` whose every batch
costs a fixed latency (``--input-delay-ms`` with ``--loader-workers``): a read from slow
storage, emulated by a sleep in the worker that fetches the batch. Sleeping costs no CPU, so
more workers (and a deeper prefetch) genuinely hide it, even on a machine with two cores, as
on a real cluster whose loader waits on the network.

Its ``loader_workers`` and ``prefetch_factor`` are knobs (:mod:`tuneloop.agent.torch_loader`):
the input-bound verdict job declares them, and a study from its diagnosis tunes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, Dataset

from tuneloop.agent.torch_loader import LoaderSettings

Batch = tuple[torch.Tensor, torch.Tensor]


class SlowBatches(Dataset[Batch]):
    """One shuffled pass of ``(x, y)`` in batches of ``batch``; fetching one sleeps
    ``delay_s`` first."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, batch: int, order: torch.Tensor, delay_s: float
    ) -> None:
        self.x, self.y, self.batch, self.order, self.delay_s = x, y, batch, order, delay_s

    def __len__(self) -> int:
        return len(self.order) // self.batch

    def __getitem__(self, index: int) -> Batch:
        time.sleep(self.delay_s)
        rows = self.order[index * self.batch : (index + 1) * self.batch]
        return self.x[rows], self.y[rows]


def slow_loader_factory(
    x: torch.Tensor, y: torch.Tensor, seed: int, delay_s: float, settings: LoaderSettings
) -> Callable[[int], DataLoader[Batch]]:
    """``make_loader(batch)`` for :class:`~tuneloop.agent.torch.TunedTraining`: a loader of
    whole batches (``batch_size=None``) with the workers and prefetch ``settings`` hold now."""
    passes = [0]

    def make_loader(batch: int) -> DataLoader[Batch]:
        passes[0] += 1
        order = torch.randperm(
            len(y), generator=torch.Generator().manual_seed(seed * 997 + passes[0])
        )
        dataset = SlowBatches(x, y, batch, order, delay_s)
        return DataLoader(dataset, batch_size=None, **settings.kwargs())

    return make_loader
