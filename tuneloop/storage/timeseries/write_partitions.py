"""Which partitions of ``samples`` a write needs, as partition indexes (days since the epoch
divided by the partition width), and how to create them in bounded runs."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import numpy as np

from tuneloop.storage.timeseries.partitions import partition_index
from tuneloop.storage.timeseries.write_validation import Accepted, SampleArrays

_DAY_US = 86_400 * 1_000_000


def batch_partitions(accepted: list[Accepted], partition_days: int) -> set[int]:
    needed: set[int] = set()
    # Batches of one collection share their timestamps: compute each one's partition once.
    known: dict[datetime, int] = {}
    for item in accepted:
        first = known.get(item.first)
        if first is None:
            first = known[item.first] = partition_index(item.first, partition_days)
        last = known.get(item.last)
        if last is None:
            last = known[item.last] = partition_index(item.last, partition_days)
        if first == last:
            needed.add(first)
        else:
            # Only a batch crossing a boundary pays a per-sample look, and only for its own
            # partitions: a stray old sample must not create every partition in between.
            needed.update(partition_index(ts, partition_days) for ts in item.timestamps)
    return needed


def block_partitions(blocks: list[SampleArrays], partition_days: int) -> set[int]:
    needed: set[int] = set()
    width = _DAY_US * partition_days
    for _, micros, _ in blocks:
        first, last = int(micros.min()) // width, int(micros.max()) // width
        if first == last:
            needed.add(first)
        else:
            needed.update(np.unique(micros // width).tolist())
    return needed


def partition_runs(indexes: list[int], longest: int) -> Iterable[tuple[int, int]]:
    """Consecutive stretches of sorted ``indexes`` as (first, last), none longer than
    ``longest``."""
    start = previous = indexes[0]
    for index in indexes[1:]:
        if index != previous + 1 or index - start >= longest:
            yield start, previous
            start = index
        previous = index
    yield start, previous
