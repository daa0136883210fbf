"""The one contract every sink follows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tuneloop.storage.timeseries.types import SeriesBatch, WriteResult


class Sink(Protocol):
    def write(self, batches: Sequence[SeriesBatch]) -> WriteResult:
        """Write the batches; raise only when nothing could be written (to retry later)."""
        ...
