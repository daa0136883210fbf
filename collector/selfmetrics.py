"""The collector's own metrics, on a registry passed in (the API app's, so they show on its
``/metrics``; or the one ``tuneloop collect --metrics-port`` serves).

Every accepted sample ends up counted exactly once as written or rejected; until then it is in
``queue_depth`` (memory) or in the spool (``spool_bytes``). Rejection reasons are a small fixed
set, so the label cannot grow with bad input.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Final
from weakref import WeakKeyDictionary

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tuneloop.storage.timeseries.types import Rejection, RejectionCode

_log = logging.getLogger("collector.pipeline")  # where the rejections were always logged

OTHER_REJECTION: Final = "other"
"""The label of a rejection whose code is not a :class:`RejectionCode` (a third-party sink)."""

REASONS: Final = (
    # The store's rejections, labelled by their code (see RejectionCode)...
    *(code.value for code in RejectionCode),
    OTHER_REJECTION,
    # ...and the pipeline's own reasons.
    "relabel_drop",  # a relabel rule (keep/drop) dropped the series on purpose
    "queue_full",  # PipelineFull: the caller was told to retry later
    "write_failed",  # the store raised a permanent (not connection) error
    "shutdown_lost",  # memory could not be spooled when the process stopped
)

WRITE_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

_BY_REGISTRY: WeakKeyDictionary[CollectorRegistry, CollectorMetrics] = WeakKeyDictionary()
_BY_REGISTRY_LOCK = threading.Lock()


_FORWARD_BY_REGISTRY: WeakKeyDictionary[CollectorRegistry, CollectorMetrics] = WeakKeyDictionary()
_PREFIX: Final = "tuneloop_collector_"
FORWARD_PREFIX: Final = "tuneloop_forward_"


class _Renamed(Collector):
    """Every metric of ``source`` with its ``old`` name prefix changed to ``new``."""

    def __init__(self, source: CollectorRegistry, old: str, new: str) -> None:
        self._source, self._old, self._new = source, old, new

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            renamed = Metric(
                family.name.replace(self._old, self._new, 1),
                family.documentation,
                family.type,
                family.unit,
            )
            renamed.samples = [
                sample._replace(name=sample.name.replace(self._old, self._new, 1))
                for sample in family.samples
            ]
            yield renamed


_STORE_CODES: Final = frozenset(code.value for code in RejectionCode)


def rejection_reason(rejection: Rejection) -> str:
    """The metric label of a store rejection: its code, kept to the known set so that the
    label's values cannot grow with whatever a sink puts there."""
    return rejection.code if rejection.code in _STORE_CODES else OTHER_REJECTION


class CollectorMetrics:
    """Counters of the pipeline and gauges of its buffers, plus per-source health."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.received = Counter(
            "tuneloop_collector_points_received",
            "Samples handed to the pipeline (before relabelling).",
            registry=r,
        )
        self.written = Counter(
            "tuneloop_collector_points_written", "Samples committed to the store.", registry=r
        )
        self.rejected = Counter(
            "tuneloop_collector_points_rejected",
            "Samples not stored, by reason; never retried.",
            ["reason"],
            registry=r,
        )
        self.spooled = Counter(
            "tuneloop_collector_points_spooled",
            "Samples written to the on-disk spool while the store was unreachable.",
            registry=r,
        )
        self.queue_depth = Gauge(
            "tuneloop_collector_queue_depth", "Samples waiting in memory.", registry=r
        )
        self.spool_bytes = Gauge(
            "tuneloop_collector_spool_bytes", "Bytes in the spool not yet replayed.", registry=r
        )
        self.write_duration = Histogram(
            "tuneloop_collector_write_duration_seconds",
            "Time of one write to the store (successful or not).",
            buckets=WRITE_BUCKETS,
            registry=r,
        )
        self.source_errors = Counter(
            "tuneloop_collector_source_errors",
            "Failed polls, by source.",
            ["source"],
            registry=r,
        )
        self.source_up = Gauge(
            "tuneloop_collector_source_up",
            "1 when the source's last poll succeeded, 0 when it failed.",
            ["source"],
            registry=r,
        )
        for reason in REASONS:  # present at 0 from the start, so rate() works on the first one
            self.rejected.labels(reason=reason)

    @classmethod
    def for_registry(cls, registry: CollectorRegistry | None) -> CollectorMetrics:
        """The metrics on ``registry``, created once: a second pipeline on the same registry
        (an app started twice in tests) shares them instead of failing on duplicate names."""
        if registry is None:
            return cls()
        with _BY_REGISTRY_LOCK:
            found = _BY_REGISTRY.get(registry)
            if found is None:
                found = _BY_REGISTRY[registry] = cls(registry)
            return found

    @classmethod
    def for_forward(cls, registry: CollectorRegistry | None) -> CollectorMetrics:
        """A forwarding pipeline's metrics, shown on ``registry`` as ``tuneloop_forward_*``
        beside the store pipeline's ``tuneloop_collector_*`` (created once per registry)."""
        if registry is None:
            return cls()
        with _BY_REGISTRY_LOCK:
            found = _FORWARD_BY_REGISTRY.get(registry)
            if found is None:
                found = _FORWARD_BY_REGISTRY[registry] = cls()
                registry.register(_Renamed(found.registry, _PREFIX, FORWARD_PREFIX))
            return found

    def reject(self, reason: str, samples: int) -> None:
        if samples > 0:
            self.rejected.labels(reason=reason).inc(samples)

    def count_rejections(self, rejections: Sequence[Rejection]) -> None:
        """Count a write's (or the spool's) rejections by reason, and log them once."""
        if not rejections:
            return
        by_reason: dict[str, int] = {}
        for rejection in rejections:
            reason = rejection_reason(rejection)
            by_reason[reason] = by_reason.get(reason, 0) + rejection.samples
        for reason, samples in by_reason.items():
            self.reject(reason, samples)
        # One line per write, not per series: a project over its series cap would flood the log.
        first = rejections[0]
        _log.warning(
            "rejected %s in %d series; first: %s %s: %s",
            ", ".join(f"{samples} samples ({reason})" for reason, samples in by_reason.items()),
            len(rejections),
            first.metric,
            dict(first.labels),
            first.reason,
        )
