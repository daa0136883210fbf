"""Export requests of a shape seen before, decoded in bulk straight into columns.

An exporter sends the same request again and again with new numbers: every export of a
periodic OpenTelemetry SDK reader, or of a collector batching a fixed set of series over a fixed
window, has the same resources, scopes, metrics and points in the same order, with the same
attributes; only the points' times and values differ, and those are fixed-width fields
(``fixed64`` times, ``double`` or ``sfixed64`` values). So once such a request has been mapped
point by point (:mod:`collector.otlp.metrics`), its **shape** is kept: the body with those
8-byte payloads zeroed (the skeleton), where they are, and the series each point went to. A
later body of the same length whose bytes equal the skeleton everywhere but at those payloads
is the same message but for those numbers, so it maps to the same series: its times and values
are read with a handful of numpy operations into a :class:`SampleColumns`, with no protobuf
parse and no Python object per point.

Exactly what the point-by-point mapping would produce, or nothing: a shape is learned only from
a request that mapped with no rejection, whose points are all gauge or cumulative sum points
with a value (no histogram, summary, delta sum or ``NO_RECORDED_VALUE`` point: those need more
than the numbers), and whose encoding is canonical (every message's fields in number order, no
singular field twice, no unknown field where the walk descends, each point's time and value in
its leading records, as :mod:`collector.otlp.wire` reads them). A matching request whose
numbers the mapping would refuse (a time out of range, NaN or infinity) or that has more series
than the caller's cap is handed back (``None``) to be mapped point by point, which rejects
exactly the right points.

Memory is bounded: shapes hold about their body's size plus 40-50 bytes a point; past
``max_bytes`` they are all forgotten and relearned. At most four shapes are kept per body
length; when all four keep failing to fit (an exporter whose series changed, its bodies keeping
their length), they are forgotten so that the new shape is learned.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import numpy as np
import numpy.typing as npt

from collector.otlp.common import EARLIEST, MAX_FUTURE
from collector.otlp.series_cache import KnownSeries
from collector.otlp.wire import FIXED64_RECORD, has_no_time_or_value, read_varint
from tuneloop.storage.timeseries.columns import SampleColumns, SeriesTable
from tuneloop.storage.timeseries.types import SeriesKind

DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024
_MAX_SHAPES_PER_LENGTH: Final = 4
_MISSES_BEFORE_FORGETTING: Final = 16
"""Requests of one length that fit none of its shapes (all of them known) before those go."""
_MICROSECOND: Final = timedelta(microseconds=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_EARLIEST_US: Final = (EARLIEST - _EPOCH) // _MICROSECOND

# Wire types and the tags of NumberDataPoint's leading fixed64 records (see collector.otlp.wire).
_VARINT, _I64, _LEN = 0, 1, 2
_START, _TIME, _DOUBLE, _INT = 0x11, 0x19, 0x21, 0x31
_CUMULATIVE: Final = 2
_MAX_VARINT_BYTES: Final = 10

Recorded = tuple[KnownSeries, SeriesKind]
"""What the mapping recorded for one number point: its series and that series' kind."""


class _NotCanonical(Exception):
    """The body is not one the walk can vouch for."""


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a body's numbers are: per number point, in order, the offsets of the 8-byte
    payloads of its time and value, whether the value is an ``sfixed64``, and every payload
    of its leading records (start time included)."""

    times: list[int]
    values: list[int]
    ints: list[bool]
    masked: list[int]


@dataclass(frozen=True, slots=True, eq=False)
class _Shape:
    skeleton: bytes
    masked: npt.NDArray[np.intp]
    """Start offsets of the 8-byte payloads the skeleton has zeroed."""
    times: npt.NDArray[np.intp]
    values: npt.NDArray[np.intp]
    """Start offsets of each point's time and value payloads."""
    ints: npt.NDArray[np.bool_] | None
    """Which values are ``sfixed64`` (``None``: none is)."""
    series: npt.NDArray[np.intp]
    table: SeriesTable

    @property
    def size(self) -> int:
        arrays = (self.masked, self.times, self.values, self.series)
        return len(self.skeleton) + sum(array.nbytes for array in arrays)


class ShapeCache:
    """Shapes of the requests seen, by body length. Shared by the threads of one receiver:
    a shape never changes once made, and learning takes a lock."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self._shapes: dict[int, list[_Shape]] = {}
        self._seen_lengths: set[int] = set()
        self._misses: dict[int, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(map(len, list(self._shapes.values())))

    def match(self, body: bytes, now: datetime, max_series: int) -> SampleColumns | None:
        """The samples of ``body`` if it has a known shape and the point-by-point mapping
        would accept all of its points; else ``None`` (map it point by point)."""
        length = len(body)
        shapes = self._shapes.get(length, ())
        for shape in shapes:
            columns = _read(shape, body, now, max_series)
            if columns is not None:
                return columns
        if len(shapes) >= _MAX_SHAPES_PER_LENGTH:
            # None of the shapes of this length fits: they may be stale (an exporter whose
            # series changed, its bodies keeping their length). Forget them after a while,
            # so that the new shape can be learned.
            misses = self._misses.get(length, 0) + 1
            self._misses[length] = misses
            if misses >= _MISSES_BEFORE_FORGETTING:
                with self._lock:
                    dropped = self._shapes.pop(length, [])
                    self._bytes -= sum(shape.size for shape in dropped)
                    self._misses.pop(length, None)
        return None

    def wants(self, body: bytes) -> bool:
        """Whether to record the mapping of ``body`` for :meth:`learn`: when a body of its
        length has been seen before (an exporter repeating itself), and few shapes of that
        length are known; a body of a length never seen only has its length noted, so that
        traffic that never repeats costs no learning."""
        length = len(body)
        if length not in self._seen_lengths:
            with self._lock:
                if len(self._seen_lengths) >= 100_000:
                    self._seen_lengths.clear()
                self._seen_lengths.add(length)
            return False
        return len(self._shapes.get(length, ())) < _MAX_SHAPES_PER_LENGTH

    def learn(self, body: bytes, recorded: Sequence[Recorded], points: int) -> bool:
        """Keep the shape of ``body``, whose points the mapping accepted every one of, in
        order, as ``recorded`` (``points`` in all). ``False`` if it has no usable shape."""
        if len(recorded) != points or not points:
            return False
        try:
            layout = _layout(body)
        except (_NotCanonical, IndexError):
            return False
        if len(layout.times) != points:
            return False
        shape = _make_shape(body, layout, recorded)
        with self._lock:
            if self._bytes + shape.size > self.max_bytes:
                self._shapes.clear()
                self._misses.clear()
                self._bytes = 0
            if shape.size > self.max_bytes:
                return False
            known = self._shapes.setdefault(len(body), [])
            if len(known) >= _MAX_SHAPES_PER_LENGTH:
                return False
            self._shapes[len(body)] = [*known, shape]  # readers iterate a list never changed
            self._bytes += shape.size
        return True


def _make_shape(body: bytes, layout: _Layout, recorded: Sequence[Recorded]) -> _Shape:
    masked = np.array(layout.masked, dtype=np.intp)
    skeleton = bytearray(body)
    _words(skeleton)[masked] = 0
    # The table: each series once, in the order the mapping's builder made its batches.
    index_of: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    metrics: list[str] = []
    labels: list[dict[str, str]] = []
    kinds: list[SeriesKind] = []
    series = np.empty(len(recorded), dtype=np.intp)
    for point, (known, kind) in enumerate(recorded):
        index = index_of.get(known.key)
        if index is None:
            index = index_of[known.key] = len(metrics)
            metrics.append(known.key[0])
            labels.append(known.labels)
            kinds.append(kind)
        series[point] = index
    ints = np.array(layout.ints, dtype=np.bool_)
    return _Shape(
        skeleton=bytes(skeleton),
        masked=masked,
        times=np.array(layout.times, dtype=np.intp),
        values=np.array(layout.values, dtype=np.intp),
        ints=ints if ints.any() else None,
        series=series,
        table=SeriesTable(tuple(metrics), tuple(labels), tuple(kinds)),
    )


def _read(shape: _Shape, body: bytes, now: datetime, max_series: int) -> SampleColumns | None:
    if len(shape.table) > max_series:
        return None  # the builder's cap would refuse some points: let it say which
    masked = bytearray(body)
    _words(masked)[shape.masked] = 0
    if masked != shape.skeleton:
        return None
    words = _words(body)
    nanos = words[shape.times]
    raw = words[shape.values]
    values = raw.view("<f8")
    if shape.ints is not None:
        # float(as_int), as the mapping does: both round to the nearest double.
        values = np.where(shape.ints, raw.view("<i8").astype(np.float64), values)
    if not np.isfinite(values).all():
        return None  # NaN or infinity: the mapping rejects those points
    micros = (nanos // 1_000).astype(np.int64)
    latest = (now + MAX_FUTURE - _EPOCH) // _MICROSECOND
    if int(micros.min()) < _EARLIEST_US or int(micros.max()) > latest:
        return None
    return SampleColumns(shape.table, shape.series, micros, values.astype(np.float64, copy=False))


def _words(data: bytes | bytearray) -> npt.NDArray[np.uint64]:
    """Every 8 consecutive bytes of ``data`` as a little-endian integer, by its first byte's
    offset (a view, unaligned): a payload is read or zeroed with one index, not eight."""
    return np.ndarray(
        shape=(max(len(data) - 7, 0),), dtype="<u8", buffer=data, offset=0, strides=(1,)
    )


# ---------------------------------------------------------------------- the walk


def _layout(body: bytes) -> _Layout:
    """Where the numbers of an ``ExportMetricsServiceRequest`` encoding are; raises
    :class:`_NotCanonical` for anything the shape could not vouch for."""
    layout = _Layout([], [], [], [])
    for _, start, end in _message(body, 0, len(body), {1: (_LEN, True)}):
        _resource_metrics(body, start, end, layout)
    return layout


def _resource_metrics(data: bytes, start: int, end: int, layout: _Layout) -> None:
    spec = {1: (_LEN, False), 2: (_LEN, True), 3: (_LEN, False)}
    for field, begin, stop in _message(data, start, end, spec):
        if field == 2:
            _scope_metrics(data, begin, stop, layout)


def _scope_metrics(data: bytes, start: int, end: int, layout: _Layout) -> None:
    spec = {1: (_LEN, False), 2: (_LEN, True), 3: (_LEN, False)}
    for field, begin, stop in _message(data, start, end, spec):
        if field == 2:
            _metric(data, begin, stop, layout)


_METRIC = {
    1: (_LEN, False),  # name
    2: (_LEN, False),  # description
    3: (_LEN, False),  # unit
    5: (_LEN, False),  # gauge
    7: (_LEN, False),  # sum
    12: (_LEN, True),  # metadata
}
# histogram (9), exponential histogram (10), summary (11): not in a shape (unknown here).
_GAUGE = {1: (_LEN, True)}  # data_points
_SUM = {1: (_LEN, True), 2: (_VARINT, False), 3: (_VARINT, False)}  # + temporality, monotonic


def _metric(data: bytes, start: int, end: int, layout: _Layout) -> None:
    data_fields = 0
    for field, begin, stop in _message(data, start, end, _METRIC):
        if field == 5:
            data_fields += 1
            _points(data, begin, stop, layout, _GAUGE)
        elif field == 7:
            data_fields += 1
            _points(data, begin, stop, layout, _SUM)
    if data_fields > 1:
        raise _NotCanonical("a metric with two kinds of data")


def _points(
    data: bytes, start: int, end: int, layout: _Layout, spec: dict[int, tuple[int, bool]]
) -> None:
    """The points of a gauge (``spec`` without field 2) or a sum (only cumulative)."""
    temporality = None
    for field, begin, stop in _message(data, start, end, spec):
        if field == 1:
            _point(data, begin, stop, layout)
        elif field == 2:
            temporality = _varint(data, begin)[0]
    if 2 in spec and temporality != _CUMULATIVE:
        raise _NotCanonical("not a cumulative sum")


def _point(data: bytes, start: int, end: int, layout: _Layout) -> None:
    """A NumberDataPoint in one of the layouts of :func:`collector.otlp.wire.number_points`:
    ``[start] time value`` leading, nothing of those fields after."""
    position = start
    if data[position] == _START:
        layout.masked.append(position + 1)
        position += FIXED64_RECORD
    if position + 2 * FIXED64_RECORD > end or data[position] != _TIME:
        raise _NotCanonical("a point without its time in front")
    value_tag = data[position + FIXED64_RECORD]
    if value_tag not in (_DOUBLE, _INT):
        raise _NotCanonical("a point without its value after its time")
    layout.masked.extend((position + 1, position + FIXED64_RECORD + 1))
    layout.times.append(position + 1)
    layout.values.append(position + FIXED64_RECORD + 1)
    layout.ints.append(value_tag == _INT)
    if not has_no_time_or_value(data[position + 2 * FIXED64_RECORD : end]):
        raise _NotCanonical("a point with a time or value after its leading records")


def _message(
    data: bytes, start: int, end: int, spec: dict[int, tuple[int, bool]]
) -> list[tuple[int, int, int]]:
    """The fields of the message in ``data[start:end]`` as (field, payload start, payload
    end), varints as (field, their offset, their end). Canonical only: every field known to
    ``spec`` (field -> (wire type, repeated)) with its wire type, in number order, a singular
    one at most once."""
    fields: list[tuple[int, int, int]] = []
    previous = 0
    position = start
    while position < end:
        tag, position = _varint(data, position)
        field, wire_type = tag >> 3, tag & 7
        known = spec.get(field)
        if known is None or known[0] != wire_type:
            raise _NotCanonical(f"field {field} (wire type {wire_type})")
        if field < previous or (field == previous and not known[1]):
            raise _NotCanonical(f"field {field} out of order or repeated")
        previous = field
        if wire_type == _LEN:
            length, position = _varint(data, position)
            fields.append((field, position, position + length))
            position += length
        else:
            _, after = _varint(data, position)
            fields.append((field, position, after))
            position = after
    if position != end:
        raise _NotCanonical("a field runs past its message")
    return fields


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value, after = read_varint(data, position)
    if after - position > _MAX_VARINT_BYTES:  # protobuf refuses these: so does the walk
        raise _NotCanonical(f"a varint longer than {_MAX_VARINT_BYTES} bytes")
    return value, after
