"""Assembles the collector's parts from the settings, for ``tuneloop up``, ``tuneloop collect``,
``tuneloop api`` and the API app's lifespan."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from collector.fanout import FanOut, WritePipeline
from collector.pipeline import Pipeline, PipelineConfig
from collector.relabel import Relabeler, load_rules
from collector.runner import CollectorRunner
from collector.selfmetrics import CollectorMetrics
from collector.sinks.backend import BackendSink
from collector.sinks.base import Sink
from collector.sinks.remote_write import RemoteWriteSink
from collector.sinks.store import StoreSink
from collector.sources import SourceSpecError, build_sources
from collector.sources.auto import AUTO, Detection, detect_sources, expand_auto, kind_of, uses_auto
from collector.sources.base import Source
from collector.spool import Spool
from collector.status import StatusBoard
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage.prometheus.remote_writer import RemoteWriter, without_credentials
from tuneloop.storage.timeseries.writer import SampleWriter


def pipeline_config(settings: Settings) -> PipelineConfig:
    return PipelineConfig(
        batch_max_samples=settings.batch_max_samples,
        flush_interval_s=settings.flush_interval_s,
        queue_max_samples=settings.queue_max_samples,
        retry_max_s=settings.store_retry_max_s,
        retry_initial_s=min(0.5, settings.store_retry_max_s),
        durable=settings.collector_durable,
    )


def build_pipeline(runtime: Runtime, *, registry: CollectorRegistry | None = None) -> WritePipeline:
    """A pipeline writing into ``runtime``'s store (or its TSDB, when it has one), with its
    metrics on ``registry``; with ``remote_write_url`` set, together with one forwarding there
    (:mod:`collector.fanout`).

    Raises :class:`collector.relabel.RelabelConfigError` (one line) for a bad relabel config.
    Not started: call ``start()``, and ``stop()`` before closing the runtime.
    """
    settings = runtime.settings
    rules = load_rules(settings.relabel_config) if settings.relabel_config else []
    sink: Sink
    if runtime.remote_series is not None:
        sink = BackendSink(runtime.remote_series)
        destination = without_credentials(runtime.remote_series.client.url)
    else:
        writer = SampleWriter(
            runtime.engine,
            partition_days=settings.partition_days,
            max_series_per_project=settings.max_series_per_project,
        )
        sink = StoreSink(writer)
        destination = runtime.engine.url.render_as_string(hide_password=True)
    spool = Spool(
        settings.resolved_spool_dir,
        max_bytes=settings.spool_max_bytes,
        # A slot left by a crashed process is replayed only into the store it was meant for.
        store=destination,
    )
    primary = Pipeline(
        sink,
        config=pipeline_config(settings),
        spool=spool,
        relabeler=Relabeler(rules),
        metrics=CollectorMetrics.for_registry(registry),
    )
    if not settings.remote_write_url:
        return primary
    return FanOut(primary, [forwarding_pipeline(settings, Relabeler(rules), registry=registry)])


def forwarding_pipeline(
    settings: Settings, relabeler: Relabeler, *, registry: CollectorRegistry | None = None
) -> Pipeline:
    """A pipeline forwarding to ``remote_write_url``, with a spool of its own; its metrics on
    ``registry`` as ``tuneloop_forward_*``."""
    headers = dict(settings.remote_write_headers)
    if settings.remote_write_bearer_token is not None:
        headers["Authorization"] = f"Bearer {settings.remote_write_bearer_token.get_secret_value()}"
    url = settings.remote_write_url
    spool = Spool(
        settings.resolved_remote_write_spool_dir,
        max_bytes=settings.spool_max_bytes,
        # Replayed only to the destination it was meant for (credentials left out).
        store=without_credentials(url),
    )
    writer = RemoteWriter(url, headers=headers, timeout_s=settings.remote_write_timeout_s)
    return Pipeline(
        RemoteWriteSink(writer),
        config=pipeline_config(settings),
        spool=spool,
        relabeler=relabeler,
        metrics=CollectorMetrics.for_forward(registry),
    )


@dataclass(frozen=True, slots=True)
class SourcePlan:
    """The sources a collector runs, and each one's poll interval (by source name)."""

    sources: list[Source]
    intervals: dict[str, float]
    gpu_choice: str | None = None
    """With ``auto``: which GPU source it chose and why, for the caller to log once start-up
    has passed its other checks (so that their errors stay the only output)."""

    def describe(self) -> str:
        """One line for a start-up banner: ``host every 15s, nvml every 10s``."""
        return ", ".join(f"{name} every {s:g}s" for name, s in self.intervals.items()) or "none"


def interval_for(source_name: str, settings: Settings) -> float:
    """The poll interval of a source by its kind: GPUs every ``gpu_interval_s``, scraped
    exporters every ``scrape_interval_s``, the host and InfiniBand every ``collect_interval_s``."""
    kind = kind_of(source_name)
    if kind in ("nvml", "dcgm"):
        return settings.gpu_interval_s
    if kind == "scrape":
        return settings.scrape_interval_s
    return settings.collect_interval_s


def plan_sources(
    settings: Settings, *, detect: Callable[[], Detection] = detect_sources
) -> SourcePlan:
    """The sources named by ``settings.sources``, ``auto`` detected by ``detect()``.

    Raises :class:`collector.sources.SourceSpecError` (one line) for a bad spec. Builds the
    sources without starting them: no GPU or network is touched beyond ``auto``'s probes.
    """
    specs = list(settings.sources)
    for spec in specs:
        if kind_of(spec) == AUTO and spec.strip().lower() != AUTO:
            raise SourceSpecError(f"{spec!r}: auto takes no value")
    gpu_choice = None
    if uses_auto(specs):
        detection = detect()
        gpu_choice = f"GPU source: {detection.gpu_source or 'none'} ({detection.gpu_reason})"
        specs = expand_auto(specs, detection)
    sources = build_sources(specs, dcgm_update_interval_s=settings.gpu_interval_s)
    intervals = {source.name: interval_for(source.name, settings) for source in sources}
    return SourcePlan(sources, intervals, gpu_choice)


def default_sources() -> list[Source]:
    """The sources a collector runs when none are given: this host."""
    from collector.sources.host import HostSource

    return [HostSource()]


def build_collector(
    pipeline: WritePipeline,
    project_id: int,
    *,
    interval_s: float,
    sources: list[Source] | None = None,
    intervals: Mapping[str, float] | None = None,
    board: StatusBoard | None = None,
) -> CollectorRunner:
    """A runner polling ``sources`` (default: :func:`default_sources`) into ``pipeline`` for
    ``project_id``, each every ``intervals[name]`` seconds or else ``interval_s`` (see
    :func:`plan_sources`). Start the pipeline before the runner and stop it after."""
    return CollectorRunner(
        sources if sources is not None else default_sources(),
        pipeline,
        project_id,
        interval_s=interval_s,
        intervals=intervals,
        board=board,
    )
