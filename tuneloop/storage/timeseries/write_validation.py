"""What the writer accepts: the checks a batch passes before it is stored, and the shapes the
later steps (series ids, partitions, the samples' copy) take it in.

Bad input never raises: each bad batch becomes a :class:`Rejection` and the rest is written.
NaN values are dropped (and reported) rather than stored: SQLite cannot hold NaN in a ``REAL``
column, both backends must return the same data, and NaN would poison ``max``/``avg`` over a
window. A missing value is expressed by absence of a sample. ``+inf``/``-inf`` are stored.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain
from typing import NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from tuneloop.storage.timeseries.columns import SampleColumns, SeriesTable
from tuneloop.storage.timeseries.types import (
    Rejection,
    RejectionCode,
    SeriesBatch,
    SeriesKind,
    WriteResult,
    fingerprint,
)

MAX_METRIC_LENGTH = 200
"""Length of ``series.metric``; longer names would fail the whole insert on PostgreSQL."""

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_KINDS = frozenset(kind.value for kind in SeriesKind)
_IDENTITY_LIMIT = 250_000
"""Checked (metric, kind, labels) kept before that cache is emptied (about 500 bytes each for
a dozen labels); a miss only costs the checks and the fingerprint again."""

SampleArrays: TypeAlias = tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]
]
"""Series ids, microseconds since the epoch and values of samples to write."""
SeriesSamples: TypeAlias = tuple[int, Sequence[datetime], Sequence[float]]
"""A series id with the timestamps and values of one accepted batch of it."""


class _Problem(NamedTuple):
    """Why a batch is refused: the stable code and the sentence for people."""

    code: RejectionCode
    text: str


class Identity(NamedTuple):
    """What a batch's metric, labels and kind come to once checked."""

    fingerprint: str
    kind: SeriesKind


@dataclass(slots=True)
class Accepted:
    """A batch that passed validation, with what the later steps need computed once."""

    metric: str
    labels: Mapping[str, str]
    """The batch's own (batches are not changed once handed over); copied where kept."""
    fingerprint: str
    kind: SeriesKind
    timestamps: Sequence[datetime]
    values: Sequence[float]
    first: datetime
    last: datetime


@dataclass(slots=True)
class Block:
    """A :class:`SampleColumns` whose series all passed validation and hold no NaN."""

    columns: SampleColumns
    identities: tuple[Identity, ...]
    """Of each series of the table."""
    ids: npt.NDArray[np.int64] | None = None
    """Series id of each series of the table (-1: refused by the cap), once resolved."""

    def entries(self) -> list[Accepted]:
        """The series of the table that have samples, as the batches they mean would be
        accepted (no samples attached: only resolving series needs them)."""
        table = self.columns.table
        return [
            Accepted(
                metric=table.metrics[index],
                labels=table.labels[index],
                fingerprint=self.identities[index].fingerprint,
                kind=self.identities[index].kind,
                timestamps=(),
                values=(),
                first=EPOCH,
                last=EPOCH,
            )
            for index in np.flatnonzero(self.columns.counts()).tolist()
        ]


def validate_batch(
    batch: SeriesBatch, result: WriteResult, identities: dict[tuple[object, ...], Identity]
) -> Accepted | None:
    """The batch ready to write, or ``None`` after recording why not (an empty batch is
    ``None`` with nothing recorded). ``identities``: see :func:`_identity_key`."""
    key = identity = None
    try:
        size = max(len(batch.timestamps), len(batch.values))
    except TypeError:
        problem: _Problem | None = _Problem(
            RejectionCode.INVALID_BATCH, "timestamps and values must be sequences"
        )
        size = 0
    else:
        key = _identity_key(batch)
        if key is not None:
            try:
                identity = identities.get(key)
            except TypeError:  # an unhashable label: not a string, found the long way
                key = None
        known = identity is not None
        problem = (None if known else _identity_problem(batch)) or _length_problem(batch)
    if problem is None and size:
        checked = _check_samples(batch)
        if not isinstance(checked, _Problem):
            if identity is None:
                identity = _learn(identities, key, batch)
            return _accept(batch, checked[0], checked[1], result, identity)
        problem = checked
    if problem is not None:
        labels = batch.labels if isinstance(batch.labels, Mapping) else {}
        result.rejected.append(
            Rejection(str(batch.metric), labels, size, problem.text, problem.code)
        )
    return None


def _identity_key(batch: SeriesBatch) -> tuple[object, ...] | None:
    """The metric, kind and labels (in their order) of a batch, flat: the key under which a
    batch that passed the identity checks is remembered; ``None`` (check it the long way)
    unless the labels are a plain dict.

    Equal keys mean equal parts: a batch whose key is known has the metric, kind and label
    set of one that passed :func:`_identity_problem` (strings, as only strings equal strings),
    and its fingerprint.
    """
    labels = batch.labels
    if type(labels) is not dict:
        return None
    # Flat, so that hashing it combines the strings' cached hashes and builds no pair tuples.
    return (batch.metric, batch.kind, *chain.from_iterable(labels.items()))


def table_identities(
    table: SeriesTable, identities: dict[tuple[object, ...], Identity]
) -> tuple[Identity, ...] | None:
    """The identity of each series of ``table``, by the checks a batch of it would pass (and
    the cache they share); ``None`` if one would not."""
    found: list[Identity] = []
    for metric, labels, kind in zip(table.metrics, table.labels, table.kinds, strict=True):
        probe = SeriesBatch(metric, labels, (), (), kind)
        key = _identity_key(probe)
        identity = None
        if key is not None:
            try:
                identity = identities.get(key)
            except TypeError:
                key = None
        if identity is None:
            if _identity_problem(probe) is not None:
                return None
            identity = _learn(identities, key, probe)
        found.append(identity)
    return tuple(found)


def _learn(
    identities: dict[tuple[object, ...], Identity],
    key: tuple[object, ...] | None,
    batch: SeriesBatch,
) -> Identity:
    """The identity of a batch that passed the checks, remembered under ``key``."""
    identity = Identity(fingerprint(batch.metric, batch.labels), SeriesKind(batch.kind))
    if key is not None:
        if len(identities) >= _IDENTITY_LIMIT:
            identities.clear()
        identities[key] = identity
    return identity


def _accept(
    batch: SeriesBatch,
    total: float,
    time_range: tuple[datetime, datetime],
    result: WriteResult,
    identity: Identity,
) -> Accepted | None:
    """A valid batch, less its NaN values (dropped and recorded)."""
    timestamps, values = batch.timestamps, batch.values
    first, last = time_range
    if total != total and any(math.isnan(value) for value in values):
        timestamps, values = _drop_nan(batch, result)
        if not values:
            return None
        first, last = min(timestamps), max(timestamps)
    return Accepted(
        metric=batch.metric,
        labels=batch.labels,
        fingerprint=identity.fingerprint,
        kind=identity.kind,
        timestamps=timestamps,
        values=values,
        first=first,
        last=last,
    )


def _check_samples(batch: SeriesBatch) -> tuple[float, tuple[datetime, datetime]] | _Problem:
    """(sum of values, (earliest, latest timestamp)), or why the samples are unusable."""
    total = _value_sum(batch.values)
    if isinstance(total, str):
        return _Problem(RejectionCode.INVALID_VALUE, total)
    time_range = _time_range(batch.timestamps)
    if isinstance(time_range, str):
        return _Problem(RejectionCode.INVALID_TIMESTAMP, time_range)
    return total, time_range


def _identity_problem(batch: SeriesBatch) -> _Problem | None:
    metric = batch.metric
    if not isinstance(metric, str) or not metric:
        return _Problem(RejectionCode.INVALID_METRIC, "metric name must be a non-empty string")
    if len(metric) > MAX_METRIC_LENGTH:
        return _Problem(
            RejectionCode.INVALID_METRIC,
            f"metric name is longer than {MAX_METRIC_LENGTH} characters",
        )
    if "\x00" in metric:
        return _Problem(RejectionCode.INVALID_METRIC, "metric name contains a NUL character")
    labels_problem = _labels_problem(batch.labels)
    if labels_problem is not None:
        return _Problem(RejectionCode.INVALID_LABELS, labels_problem)
    if not isinstance(batch.kind, str) or batch.kind not in _KINDS:
        return _Problem(
            RejectionCode.INVALID_KIND,
            f"kind must be one of {', '.join(sorted(_KINDS))}, got {batch.kind!r}",
        )
    return None


def _labels_problem(labels: Mapping[str, str]) -> str | None:
    if not isinstance(labels, Mapping):
        return "labels must be a mapping of strings to strings"
    for name, value in labels.items():
        if not isinstance(name, str) or not name:
            return f"label name {name!r} is not a non-empty string"
        if not isinstance(value, str):
            return f"label {name!r} has a non-string value ({type(value).__name__})"
        if "\x00" in name or "\x00" in value:
            return f"label {name!r} contains a NUL character"
    return None


def _length_problem(batch: SeriesBatch) -> _Problem | None:
    if len(batch.timestamps) != len(batch.values):
        return _Problem(
            RejectionCode.LENGTH_MISMATCH,
            f"{len(batch.timestamps)} timestamps but {len(batch.values)} values: "
            "they must pair one to one",
        )
    return None


def _time_range(timestamps: Sequence[datetime]) -> tuple[datetime, datetime] | str:
    """(earliest, latest), or why the timestamps are unusable.

    ``min``/``max`` double as the type check, in C: comparing a naive with an aware datetime,
    or a datetime with anything else, raises; so after them only "all naive" or "all of some
    other type" is left to rule out, from one element.
    """
    try:
        first, last = min(timestamps), max(timestamps)
    except TypeError:
        return _timestamp_problem(timestamps)
    if not isinstance(first, datetime) or first.utcoffset() is None:
        return _timestamp_problem(timestamps)
    return first, last


def _timestamp_problem(timestamps: Sequence[datetime]) -> str:
    for index, ts in enumerate(timestamps):
        if not isinstance(ts, datetime):
            return f"timestamps[{index}] is not a datetime ({type(ts).__name__})"
        if ts.utcoffset() is None:
            return f"timestamps[{index}] is a naive datetime: timestamps must be timezone-aware"
    return "timestamps cannot be compared with each other"


def _value_sum(values: Sequence[float]) -> float | str:
    """The sum of the values (NaN if one is NaN, which is allowed here and dropped later), or
    why they are unusable. Summing is the type check, in C; only a failure rescans."""
    try:
        total = sum(values, 0.0)
    except (TypeError, OverflowError):
        total = None
    if isinstance(total, float):
        return total
    for index, value in enumerate(values):
        if not isinstance(value, numbers.Real):
            return f"values[{index}] is not a real number ({type(value).__name__})"
        try:
            float(value)
        except OverflowError:
            return f"values[{index}] does not fit in a 64-bit float"
    return "values are not real numbers"


def _drop_nan(batch: SeriesBatch, result: WriteResult) -> tuple[list[datetime], list[float]]:
    kept = [
        (ts, value)
        for ts, value in zip(batch.timestamps, batch.values, strict=True)
        if value == value
    ]
    dropped = len(batch.values) - len(kept)
    result.rejected.append(
        Rejection(
            batch.metric,
            batch.labels,
            dropped,
            f"{dropped} NaN value(s) dropped: NaN is not stored (a missing value is no sample)",
            RejectionCode.NAN_VALUE,
        )
    )
    return [ts for ts, _ in kept], [value for _, value in kept]


def cap_rejection(item: Accepted, project_id: int, cap: int, samples: int) -> Rejection:
    return Rejection(
        item.metric,
        item.labels,
        samples,
        f"series limit reached: project {project_id} may have at most {cap} series "
        f"(max_series_per_project={cap}); this new series was not created",
        RejectionCode.SERIES_LIMIT,
    )
