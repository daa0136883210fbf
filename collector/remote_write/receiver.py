"""The remote-write receiver: a ``WriteRequest`` body in, series handed to ``submit``, an
outcome out that the route turns into the status a Prometheus receiver gives.

Framework-free, so it is tested without HTTP. Refused as a whole (nothing kept): a content type
or encoding other than remote-write 1.0's (415), a body over the limit (413), bad snappy or
protobuf (400). Refused in part (the rest kept, then 400 naming what was refused, which a
sender does not retry): a series without a valid ``__name__``, with an invalid or duplicated
label name; samples of a series out of order or repeating a timestamp with another value.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice, repeat
from typing import Final

import numpy as np

from tuneloop import remote_write
from tuneloop.remote_write import METRIC_NAME_LABEL
from tuneloop.storage.timeseries.columns import (
    MAX_MICROS,
    MIN_MICROS,
    Batch,
    SampleColumns,
    SeriesTable,
)
from tuneloop.storage.timeseries.types import SeriesKind
from tuneloop.storage.timeseries.write_validation import MAX_METRIC_LENGTH

Submit = Callable[[Sequence[Batch]], None]
"""Hands batches on for writing; raises (``PipelineFull``) to refuse them all."""

CONTENT_TYPE: Final = "application/x-protobuf"
CONTENT_ENCODING: Final = "snappy"
COUNTER_SUFFIXES: Final = ("_total", "_count", "_sum", "_bucket")
MAX_REASONS: Final = 5
"""Refusals named in the answer; the rest are counted."""

# Prometheus's own (pre-UTF-8) name rules, which every remote-write sender produces.
_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MS_RANGE: Final = (MIN_MICROS // 1000 + 1, MAX_MICROS // 1000 - 1)


class RemoteWriteRefused(Exception):
    """The whole request is refused with ``status``; nothing of it was kept."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Malformed(RemoteWriteRefused):
    def __init__(self, message: str) -> None:
        super().__init__(400, message)


class TooLarge(RemoteWriteRefused):
    def __init__(self, message: str) -> None:
        super().__init__(413, message)


class UnsupportedMedia(RemoteWriteRefused):
    def __init__(self, message: str) -> None:
        super().__init__(415, message)


@dataclass(slots=True)
class WriteOutcome:
    """What became of a request that was not refused as a whole."""

    series: int = 0
    samples_kept: int = 0
    samples_refused: int = 0
    samples_nan: int = 0
    """NaN values (stale markers among them): not samples the store keeps, and no error."""
    reasons: list[str] = field(default_factory=list)
    refusals: int = 0

    def refuse(self, reason: str, samples: int) -> None:
        self.refusals += 1
        self.samples_refused += samples
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(reason)

    @property
    def message(self) -> str:
        """The 400 answer's text (empty when nothing was refused)."""
        if not self.refusals:
            return ""
        more = self.refusals - len(self.reasons)
        tail = f"; and {more} more" if more else ""
        return "; ".join(self.reasons) + tail


def kind_of(metric: str) -> SeriesKind:
    """Remote write carries no metric type (1.0 sends metadata apart, if at all), so the kind
    follows Prometheus's naming conventions: a counter when the name ends in ``_total``,
    ``_count``, ``_sum`` or ``_bucket`` (counters and the cumulative parts of histograms and
    summaries), else a gauge."""
    return SeriesKind.COUNTER if metric.endswith(COUNTER_SUFFIXES) else SeriesKind.GAUGE


def check_headers(content_type: str | None, content_encoding: str | None) -> None:
    """Raise :class:`UnsupportedMedia` unless the headers are remote-write 1.0's. Like
    Prometheus's receiver, missing headers are taken to mean protobuf and snappy."""
    if content_type is not None:
        media, _, params = content_type.partition(";")
        proto = dict(
            part.strip().partition("=")[::2] for part in params.split(";") if part.strip()
        ).get("proto", "prometheus.WriteRequest")
        if media.strip().lower() != CONTENT_TYPE or proto != "prometheus.WriteRequest":
            raise UnsupportedMedia(
                f"unsupported Content-Type {content_type[:80]!r}: remote write 1.0 sends "
                f"{CONTENT_TYPE}"
            )
    if content_encoding is not None and content_encoding.strip().lower() != CONTENT_ENCODING:
        raise UnsupportedMedia(
            f"unsupported Content-Encoding {content_encoding[:80]!r}: remote write 1.0 sends "
            f"{CONTENT_ENCODING}"
        )


class RemoteWriteReceiver:
    """Decodes, checks and submits write requests. Holds nothing between requests."""

    def __init__(self, *, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes

    def write(
        self,
        body: bytes,
        *,
        content_type: str | None,
        content_encoding: str | None,
        submit: Submit,
    ) -> WriteOutcome:
        """Handle one write request. Raises :class:`RemoteWriteRefused` for a request refused
        as a whole, and whatever ``submit`` raises; then nothing was kept."""
        check_headers(content_type, content_encoding)
        if len(body) > self.max_body_bytes:
            raise TooLarge(f"the body is larger than the limit of {self.max_body_bytes} bytes")
        try:
            decoded = remote_write.decode(body, max_decoded_bytes=8 * self.max_body_bytes)
        except remote_write.RemoteWriteError as exc:
            raise Malformed(str(exc)) from exc
        outcome = WriteOutcome(series=len(decoded))
        columns = _Columns()
        for item in decoded:
            _add_series(item, columns, outcome)
        block = columns.block()
        if block is not None:
            submit([block])
            outcome.samples_kept = len(block)
        return outcome


@dataclass(slots=True)
class _Columns:
    """The kept series and samples of one request, gathered into one block. Plain lists until
    the end: a request holds many short series, and numpy pays per array made."""

    metrics: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    kinds: list[SeriesKind] = field(default_factory=list)
    index: dict[tuple[str, frozenset[tuple[str, str]]], int] = field(default_factory=dict)
    last: list[tuple[int, float]] = field(default_factory=list)
    """Of each series, its last kept sample: where the next must come after."""
    series: list[int] = field(default_factory=list)
    millis: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def position(self, metric: str, labels: dict[str, str]) -> int:
        key = (metric, frozenset(labels.items()))
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.metrics)
            self.metrics.append(metric)
            self.labels.append(labels)
            self.kinds.append(kind_of(metric))
            self.last.append((_MS_RANGE[0] - 1, math.nan))
        return found

    def add(self, position: int, millis: Sequence[int], values: Sequence[float]) -> None:
        self.series.extend(repeat(position, len(millis)))
        self.millis.extend(millis)
        self.values.extend(values)
        self.last[position] = (millis[-1], values[-1])

    def block(self) -> SampleColumns | None:
        if not self.millis:
            return None
        table = SeriesTable(tuple(self.metrics), tuple(self.labels), tuple(self.kinds))
        return SampleColumns(
            table,
            np.array(self.series, dtype=np.intp),
            np.array(self.millis, dtype=np.int64) * 1000,
            np.array(self.values, dtype=np.float64),
        )


_VALID_NAMES: set[str] = set()
"""Label names seen valid lately: most requests repeat the same few."""


def _valid_label_name(name: str) -> bool:
    if name in _VALID_NAMES:
        return True
    if not _LABEL_NAME.fullmatch(name):
        return False
    if len(_VALID_NAMES) > 10_000:
        _VALID_NAMES.clear()
    _VALID_NAMES.add(name)
    return True


def _series_problem(item: remote_write.RemoteSeries, metric: str) -> str | None:
    """Why Prometheus would refuse the whole series, or ``None``."""
    duplicate = remote_write.duplicate_label(item)
    if duplicate is not None:
        return f"duplicate label name {duplicate!r}"
    if not metric:
        return "missing metric name (__name__)"
    if len(metric) > MAX_METRIC_LENGTH or not _METRIC_NAME.fullmatch(metric):
        return f"invalid metric name {metric[:80]!r}"
    for name, value in item.labels:
        if not _valid_label_name(name):
            return f"invalid label name {name[:80]!r}"
        if "\x00" in value:
            return f"label {name!r} has a NUL character"
    return None


def _describe(item: remote_write.RemoteSeries) -> str:
    labels = ",".join(f'{name}="{value[:40]}"' for name, value in item.labels[:8])
    return "{" + labels[:200] + "}"


def _add_series(item: remote_write.RemoteSeries, columns: _Columns, outcome: WriteOutcome) -> None:
    millis, values = item.timestamps_ms, item.values
    if not values:
        return
    metric = item.metric
    problem = _series_problem(item, metric)
    if problem is not None:
        outcome.refuse(f"series {_describe(item)}: {problem}", len(values))
        return
    # An empty label value means "no such label" in Prometheus.
    labels = {name: value for name, value in item.labels if value and name != METRIC_NAME_LABEL}
    position = columns.position(metric, labels)
    # The usual request: each series' samples in order, after its last, all numbers.
    if (
        columns.last[position][0] < millis[0]
        and _MS_RANGE[0] <= millis[0]
        and millis[-1] <= _MS_RANGE[1]
        and all(map(operator.lt, millis, islice(millis, 1, None)))
        and not any(map(math.isnan, values))
    ):
        columns.add(position, millis, values)
        return
    _add_samples(item, position, columns, outcome)


def _add_samples(
    item: remote_write.RemoteSeries, position: int, columns: _Columns, outcome: WriteOutcome
) -> None:
    """Sample by sample, what a TSDB appending them in order takes: each after the last one
    kept for the series (a repeat of its timestamp and value is dropped without complaint, as
    Prometheus does), at a time a datetime can hold. NaN is counted, not kept."""
    last_ms, last_value = columns.last[position]
    kept_ms: list[int] = []
    kept_values: list[float] = []
    disordered = repeated = out_of_range = 0
    for ms, value in zip(item.timestamps_ms, item.values, strict=True):
        if not _MS_RANGE[0] <= ms <= _MS_RANGE[1]:
            out_of_range += 1
        elif ms > last_ms:
            last_ms, last_value = ms, value
            if math.isnan(value):
                outcome.samples_nan += 1
            else:
                kept_ms.append(ms)
                kept_values.append(value)
        elif ms == last_ms and (
            value == last_value or (math.isnan(value) and math.isnan(last_value))
        ):
            pass  # the same sample again: nothing to store, nothing wrong
        elif ms == last_ms:
            repeated += 1
        else:
            disordered += 1
    if kept_ms:
        columns.add(position, kept_ms, kept_values)
    columns.last[position] = (last_ms, last_value)
    where = f"series {_describe(item)}"
    if disordered:
        outcome.refuse(f"{where}: {disordered} out-of-order sample(s)", disordered)
    if repeated:
        outcome.refuse(f"{where}: {repeated} duplicate sample(s) for a timestamp", repeated)
    if out_of_range:
        outcome.refuse(f"{where}: {out_of_range} sample(s) with a time out of range", out_of_range)
