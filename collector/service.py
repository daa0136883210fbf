"""Assembles the collector's parts from the settings, for ``tuneloop up``, ``tuneloop collect``,
``tuneloop api`` and the API app's lifespan."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from collector.pipeline import Pipeline, PipelineConfig
from collector.relabel import Relabeler, load_rules
from collector.runner import CollectorRunner
from collector.selfmetrics import CollectorMetrics
from collector.sinks.store import StoreSink
from collector.sources.base import Source
from collector.spool import Spool
from collector.status import StatusBoard
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage.timeseries.writer import SampleWriter


def pipeline_config(settings: Settings) -> PipelineConfig:
    return PipelineConfig(
        batch_max_samples=settings.batch_max_samples,
        flush_interval_s=settings.flush_interval_s,
        queue_max_samples=settings.queue_max_samples,
        retry_max_s=settings.store_retry_max_s,
        retry_initial_s=min(0.5, settings.store_retry_max_s),
    )


def build_pipeline(runtime: Runtime, *, registry: CollectorRegistry | None = None) -> Pipeline:
    """A pipeline writing into ``runtime``'s store, with its metrics on ``registry``.

    Raises :class:`collector.relabel.RelabelConfigError` (one line) for a bad relabel config.
    Not started: call ``start()``, and ``stop()`` before closing the runtime.
    """
    settings = runtime.settings
    rules = load_rules(settings.relabel_config) if settings.relabel_config else []
    writer = SampleWriter(
        runtime.engine,
        partition_days=settings.partition_days,
        max_series_per_project=settings.max_series_per_project,
    )
    spool = Spool(
        settings.resolved_spool_dir,
        max_bytes=settings.spool_max_bytes,
        # A slot left by a crashed process is replayed only into the store it was meant for.
        store=runtime.engine.url.render_as_string(hide_password=True),
    )
    return Pipeline(
        StoreSink(writer),
        config=pipeline_config(settings),
        spool=spool,
        relabeler=Relabeler(rules),
        metrics=CollectorMetrics.for_registry(registry),
    )


def default_sources() -> list[Source]:
    """The sources a collector runs when none are given: this host."""
    from collector.sources.host import HostSource

    return [HostSource()]


def build_collector(
    pipeline: Pipeline,
    project_id: int,
    *,
    interval_s: float,
    sources: list[Source] | None = None,
    board: StatusBoard | None = None,
) -> CollectorRunner:
    """A runner polling ``sources`` (default: :func:`default_sources`) into ``pipeline`` for
    ``project_id``. Start the pipeline before the runner and stop it after."""
    return CollectorRunner(
        sources if sources is not None else default_sources(),
        pipeline,
        project_id,
        interval_s=interval_s,
        board=board,
    )
