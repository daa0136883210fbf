"""The one contract every sink follows, and the one error that means "try again later"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tuneloop.errors import Unavailable
from tuneloop.storage.timeseries.columns import Batch
from tuneloop.storage.timeseries.types import WriteResult


class SinkUnavailable(Unavailable):
    """The store cannot be reached right now; nothing of this write was kept. The pipeline
    spools the batches and retries later. Any other exception from :meth:`Sink.write` is
    permanent for those batches: they are counted as rejected and not retried."""


class Sink(Protocol):
    def write(self, project_id: int, batches: Sequence[Batch]) -> WriteResult:
        """Write ``batches`` into ``project_id``'s series. Bad input is reported in the
        result, never raised; raise :class:`SinkUnavailable` when nothing could be written
        because the store is unreachable."""
        ...
