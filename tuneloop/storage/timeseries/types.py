"""Value types of the time-series store, shared by its writer, its queries and its callers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


def fingerprint(metric: str, labels: Mapping[str, str]) -> str:
    """Stable identity of a series within a project: 32 hex chars of SHA-256 of the metric
    name and the label set in canonical (sorted, compact JSON) form."""
    canonical = json.dumps([metric, sorted(labels.items())], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


class SeriesKind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(slots=True)
class SeriesBatch:
    """Samples of one series: ``timestamps[i]`` (aware datetimes) pairs with ``values[i]``."""

    metric: str
    labels: Mapping[str, str]
    timestamps: Sequence[datetime]
    values: Sequence[float]
    kind: SeriesKind = SeriesKind.GAUGE


class RejectionCode(StrEnum):
    """Why samples were not stored, as a stable word: a metric label and something callers can
    branch on. The message (``Rejection.reason``) may be reworded at any time; these may not."""

    INVALID_BATCH = "invalid_batch"  # timestamps or values are not sequences
    INVALID_METRIC = "invalid_metric"  # empty, too long, not a string, or a NUL character
    INVALID_LABELS = "invalid_labels"  # not a mapping of non-empty strings to strings, or NUL
    INVALID_KIND = "invalid_kind"  # not one of SeriesKind
    LENGTH_MISMATCH = "length_mismatch"  # timestamps and values do not pair one to one
    INVALID_TIMESTAMP = "invalid_timestamp"  # not an aware datetime, or out of range
    INVALID_VALUE = "invalid_value"  # not a real number, or beyond a 64-bit float
    NAN_VALUE = "nan_value"  # NaN, which the store does not keep
    SERIES_LIMIT = "series_limit"  # the project's series cap refused a new series
    UNKNOWN_PROJECT = "unknown_project"  # the project does not exist (deleted meanwhile)
    REMOTE_REJECTED = "remote_rejected"  # a remote-write destination refused them (HTTP 4xx)


@dataclass(frozen=True, slots=True)
class Rejection:
    metric: str
    labels: Mapping[str, str]
    samples: int
    reason: str
    """For people: what was wrong, with the offending detail."""
    code: str
    """For machines: one of :class:`RejectionCode`."""


@dataclass(slots=True)
class WriteResult:
    samples_written: int = 0
    # Of samples_written, those whose (series, ts) was already stored (a replay of a write
    # that had committed): skipped, the stored sample kept.
    samples_duplicate: int = 0
    series_created: int = 0
    rejected: list[Rejection] = field(default_factory=list)

    @property
    def samples_rejected(self) -> int:
        return sum(rejection.samples for rejection in self.rejected)


class SeriesLimitExceeded(Exception):
    """Raised only by callers that want all-or-nothing; the writer itself keeps the rest."""


class MatchOp(StrEnum):
    EQ = "="
    NE = "!="
    RE = "=~"
    NRE = "!~"


@dataclass(frozen=True, slots=True)
class Matcher:
    """A label matcher as in PromQL; regular expressions are fully anchored."""

    name: str
    op: MatchOp
    value: str


class Aggregation(StrEnum):
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    SUM = "sum"
    COUNT = "count"
    LAST = "last"
    QUANTILE = "quantile"


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    id: int
    metric: str
    labels: Mapping[str, str]
    kind: SeriesKind


@dataclass(slots=True)
class RangeSeries:
    """One series of a range query: ``points`` are (bucket start, aggregated value), sorted."""

    series: SeriesInfo
    points: list[tuple[datetime, float]]


@dataclass(frozen=True, slots=True)
class LatestSample:
    series: SeriesInfo
    ts: datetime
    value: float
