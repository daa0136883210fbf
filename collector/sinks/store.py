"""Writes batches into the tuneloop store of one project."""

from __future__ import annotations

from collections.abc import Sequence

from tuneloop.storage.timeseries.types import SeriesBatch, WriteResult
from tuneloop.storage.timeseries.writer import SampleWriter


class StoreSink:
    def __init__(self, writer: SampleWriter, project_id: int) -> None:
        self._writer = writer
        self._project_id = project_id

    def write(self, batches: Sequence[SeriesBatch]) -> WriteResult:
        return self._writer.write(self._project_id, batches)
