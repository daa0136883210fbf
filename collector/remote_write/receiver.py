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
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from tuneloop import remote_write
from tuneloop.storage.timeseries.columns import (
    MAX_MICROS,
    MIN_MICROS,
    Batch,
    Float64Array,
    IndexArray,
    Int64Array,
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
BoolArray = npt.NDArray[np.bool_]
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
    """The kept series and samples of one request, gathered into one block."""

    metrics: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    kinds: list[SeriesKind] = field(default_factory=list)
    index: dict[tuple[str, frozenset[tuple[str, str]]], int] = field(default_factory=dict)
    last_ms: list[tuple[int, float]] = field(default_factory=list)
    series: list[IndexArray] = field(default_factory=list)
    millis: list[Int64Array] = field(default_factory=list)
    values: list[Float64Array] = field(default_factory=list)

    def position(self, metric: str, labels: dict[str, str]) -> int:
        key = (metric, frozenset(labels.items()))
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.metrics)
            self.metrics.append(metric)
            self.labels.append(labels)
            self.kinds.append(kind_of(metric))
            self.last_ms.append((_MS_RANGE[0] - 1, math.nan))
        return found

    def block(self) -> SampleColumns | None:
        if not self.millis:
            return None
        millis = np.concatenate(self.millis)
        if not len(millis):
            return None
        table = SeriesTable(tuple(self.metrics), tuple(self.labels), tuple(self.kinds))
        return SampleColumns(
            table,
            np.concatenate(self.series).astype(np.intp),
            millis * 1000,
            np.concatenate(self.values),
        )


def _series_problem(item: remote_write.RemoteSeries) -> str | None:
    """Why Prometheus would refuse the whole series, or ``None``."""
    duplicate = remote_write.duplicate_label(item)
    if duplicate is not None:
        return f"duplicate label name {duplicate!r}"
    metric = item.metric
    if not metric:
        return "missing metric name (__name__)"
    if not _METRIC_NAME.fullmatch(metric) or len(metric) > MAX_METRIC_LENGTH:
        return f"invalid metric name {metric[:80]!r}"
    for name, value in item.labels:
        if not _LABEL_NAME.fullmatch(name):
            return f"invalid label name {name[:80]!r}"
        if "\x00" in value:
            return f"label {name!r} has a NUL character"
    return None


def _describe(item: remote_write.RemoteSeries) -> str:
    labels = ",".join(f'{name}="{value[:40]}"' for name, value in item.labels[:8])
    return "{" + labels[:200] + "}"


def _add_series(item: remote_write.RemoteSeries, columns: _Columns, outcome: WriteOutcome) -> None:
    count = len(item.values)
    if not count:
        return
    problem = _series_problem(item)
    if problem is not None:
        outcome.refuse(f"series {_describe(item)}: {problem}", count)
        return
    # An empty label value means "no such label" in Prometheus.
    labels = {name: value for name, value in item.labels if value and name != "__name__"}
    position = columns.position(item.metric, labels)
    millis = np.asarray(item.timestamps_ms, dtype=np.int64)
    values = np.asarray(item.values, dtype=np.float64)
    keep = _in_order(millis, values, position, columns, item, outcome)
    nan = np.isnan(values)
    if nan.any():
        outcome.samples_nan += int(np.count_nonzero(nan & keep))
        keep &= ~nan
    kept = int(np.count_nonzero(keep))
    if kept:
        columns.series.append(np.full(kept, position, dtype=np.intp))
        columns.millis.append(millis[keep])
        columns.values.append(values[keep])


def _in_order(
    millis: Int64Array,
    values: Float64Array,
    position: int,
    columns: _Columns,
    item: remote_write.RemoteSeries,
    outcome: WriteOutcome,
) -> BoolArray:
    """Which samples a TSDB appending them in order takes: each after the last one kept for
    the series (a repeat of its timestamp and value is dropped without complaint, as
    Prometheus does), and a time a datetime can hold."""
    last_ms, last_value = columns.last_ms[position]
    if millis[0] > last_ms and (len(millis) == 1 or bool(np.all(np.diff(millis) > 0))):
        keep = np.ones(len(millis), dtype=bool)
        if millis[0] >= _MS_RANGE[0] and millis[-1] <= _MS_RANGE[1]:
            columns.last_ms[position] = (int(millis[-1]), float(values[-1]))
            return keep
    keep = np.zeros(len(millis), dtype=bool)
    disordered = repeated = out_of_range = 0
    for i, (ms, value) in enumerate(zip(millis.tolist(), values.tolist(), strict=True)):
        if not _MS_RANGE[0] <= ms <= _MS_RANGE[1]:
            out_of_range += 1
        elif ms > last_ms:
            keep[i] = True
            last_ms, last_value = ms, value
        elif ms == last_ms and (
            value == last_value or (value != value and last_value != last_value)
        ):
            pass  # the same sample again: nothing to store, nothing wrong
        elif ms == last_ms:
            repeated += 1
        else:
            disordered += 1
    columns.last_ms[position] = (last_ms, last_value)
    where = f"series {_describe(item)}"
    if disordered:
        outcome.refuse(f"{where}: {disordered} out-of-order sample(s)", disordered)
    if repeated:
        outcome.refuse(f"{where}: {repeated} duplicate sample(s) for a timestamp", repeated)
    if out_of_range:
        outcome.refuse(
            f"{where}: {out_of_range} sample(s) with a timestamp out of range", out_of_range
        )
    return keep
