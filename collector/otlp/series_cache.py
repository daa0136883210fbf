"""The labels of data points seen before, found again by the bytes of their attributes.

Computing a point's labels means reading its attributes through the protobuf runtime (a
``KeyValue`` and an ``AnyValue`` object each, about 0.4 µs an attribute), sorting, sanitizing and
checking them. A gauge or sum point's labels are computed once instead, and found again under its
attributes key (:mod:`collector.otlp.wire`): by every later point of the series in the request
and, through the receiver's cache, in later requests, which is what makes the periodic exporter's
request (every series again, one point each) cheap.

Memory is bounded: past ``max_series`` entries everything is forgotten and relearned (an entry
is about 2 KB for a dozen labels).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Final

from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from collector.otlp.labels import check_labels, resource_labels

DEFAULT_MAX_SERIES: Final = 100_000

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
"""(metric, sorted labels): what groups samples into one batch."""
ScopeKey = tuple[bytes, str, str]
"""(serialized resource, scope name, scope version): what the base labels depend on."""


@dataclass(frozen=True, slots=True, eq=False)
class KnownSeries:
    """The checked labels of one attribute set under one metric name, computed once. Compared
    by identity (``eq=False``): a request's builder maps each one to its batch with a plain
    dict lookup, never hashing the labels again."""

    labels: dict[str, str]
    """Base (resource, scope) and point labels; shared by every batch of the series, so
    nothing may change it (nothing downstream does: the writer, spool and relabeler copy)."""
    key: SeriesKey


SKIP: Final = KnownSeries({}, ("", ()))
"""What a point flagged ``NO_RECORDED_VALUE`` is known as: accepted, nothing written (its
labels are not even computed, as for any such point)."""


class LabelCache:
    """Resource labels by serialized resource, and :class:`KnownSeries` by scope, metric name
    and attributes key (:mod:`collector.otlp.wire`). Shared by the threads of one receiver:
    every entry is a pure function of its key, so a lost race only computes one twice."""

    def __init__(self, max_series: int = DEFAULT_MAX_SERIES) -> None:
        if max_series < 1:
            raise ValueError(f"max_series must be >= 1, got {max_series}")
        self.max_series = max_series
        self._resources: dict[bytes, dict[str, str]] = {}
        self._series: dict[tuple[bytes, str, str, str], dict[bytes, KnownSeries]] = {}
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    def resource(self, key: bytes, resource: Resource) -> dict[str, str]:
        """The checked labels of ``resource`` (serialized: ``key``); raises ``Rejected``. The
        dict is shared: do not change it."""
        labels = self._resources.get(key)
        if labels is None:
            labels = resource_labels(resource.attributes)
            check_labels(labels)
            if len(self._resources) >= self.max_series:
                self._resources.clear()
            self._resources[key] = labels
        return labels

    def series_of(self, scope: ScopeKey, metric: str) -> dict[bytes, KnownSeries]:
        """The series known under ``scope`` and ``metric``, by attributes key: look up with
        ``get``, add with :meth:`remember`."""
        key = (*scope, metric)
        known = self._series.get(key)
        if known is None:
            known = self._series.setdefault(key, {})
        return known

    def remember(self, known: dict[bytes, KnownSeries], key: bytes, series: KnownSeries) -> None:
        """Keep ``series`` in ``known`` (from :meth:`series_of`) under ``key``."""
        with self._lock:
            if self._size >= self.max_series:
                # Forget everything rather than track recency on the hot path: a working set
                # larger than the cache costs one recomputation per point, as with no cache.
                self._series.clear()
                self._size = 0
            self._size += 1
        known[key] = series
