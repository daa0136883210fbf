"""Assembles the collector that runs inside ``tuneloop up`` and ``tuneloop collector``."""

from __future__ import annotations

from collector.pipeline import Pipeline
from collector.runner import CollectorRunner
from collector.sinks.store import StoreSink
from collector.sources.base import Source
from collector.sources.host import HostSource
from tuneloop.runtime import Runtime
from tuneloop.storage.timeseries.writer import SampleWriter


def build_collector(
    runtime: Runtime, project_id: int, *, interval_s: float, sources: list[Source] | None = None
) -> CollectorRunner:
    """A runner polling ``sources`` (default: this host) into ``project_id``'s series."""
    settings = runtime.settings
    writer = SampleWriter(
        runtime.engine,
        partition_days=settings.partition_days,
        max_series_per_project=settings.max_series_per_project,
    )
    pipeline = Pipeline(StoreSink(writer, project_id))
    return CollectorRunner(sources or [HostSource()], pipeline, interval_s=interval_s)
