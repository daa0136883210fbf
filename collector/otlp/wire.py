"""Number data points read from their protobuf encoding rather than through the runtime.

Each ``NumberDataPoint`` the protobuf runtime hands to Python costs a wrapper object and an
attribute lookup per field, and its attributes cost a few microseconds more (a ``KeyValue`` and
an ``AnyValue`` object each). The gauge or sum that holds the points is serialized instead (one
C call) and walked here: per point, its time and value are unpacked from the fixed-width records
at its start, and the rest of its bytes (attributes, flags, exemplars) is its **attributes
key**, under which :mod:`collector.otlp.series_cache` finds the labels computed the first time.

Wire facts relied on (the protobuf encoding, not an implementation): a message is a sequence of
records ``tag, payload``; a point is a length-delimited record of field 1 (tag ``0x0A``) of
``Gauge`` and ``Sum``, in the order of the list; in ``NumberDataPoint`` the tag bytes ``0x11``,
``0x19``, ``0x21`` and ``0x31`` are fields 2, 3, 4 and 6 (start time, time, ``as_double``,
``as_int``), each followed by exactly 8 little-endian bytes.

So a key is all of a point but a leading run of those fixed-width records: it holds every
attribute whatever order fields are written in, and two points with one key have one attribute
set. The time and value are taken from the leading records only when the point starts with one
of the layouts the runtime writes (fields in number order: ``[start] time value``); any other
point is read through its object. The walk assumes nothing else about the rest of a point:
before a key is trusted to carry no time or value of its own (:func:`has_no_time_or_value`),
which is checked once per key, its records are walked.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Final

from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint

FIXED64_TAGS: Final = frozenset({0x11, 0x19, 0x21, 0x31})
"""Tags of ``NumberDataPoint`` fields 2, 3, 4 and 6 (wire type 1: 8 bytes follow)."""
FIXED64_RECORD: Final = 9
"""One tag byte and 8 bytes of value."""
_POINT_TAG: Final = 0x0A  # Gauge.data_points / Sum.data_points: field 1, length-delimited
_START, _TIME, _DOUBLE, _INT = 0x11, 0x19, 0x21, 0x31
_TIME_FIELDS: Final = frozenset({2, 3, 4, 6})
# Offsets from a point's first byte: tag, 8 bytes, tag, 8 bytes[, tag, 8 bytes].
_TIME_DOUBLE = struct.Struct("<Qxd").unpack_from
_TIME_INT = struct.Struct("<Qxq").unpack_from
_START_TIME_DOUBLE = struct.Struct("<QxQxd").unpack_from
_START_TIME_INT = struct.Struct("<QxQxq").unpack_from

PointFields = tuple[int, bytes, int, int, float | None]
"""(index in the list, attributes key, start time, time, value; ``None``: no value set)."""


def attributes_key(serialized: bytes) -> bytes:
    """The key of one serialized ``NumberDataPoint``: all of it but its leading fixed64
    records."""
    position, end = 0, len(serialized)
    while position < end and serialized[position] in FIXED64_TAGS:
        position += FIXED64_RECORD
    return serialized[position:]


def number_points(serialized: bytes, points: Sequence[NumberDataPoint]) -> Iterator[PointFields]:
    """The fields of every point of a ``Gauge`` or ``Sum``, in order: ``serialized`` is its
    encoding, ``points`` its ``data_points`` (read instead for a point of another layout)."""
    count, index = len(points), 0
    position, end = 0, len(serialized)
    data = serialized
    while index < count and position < end and data[position] == _POINT_TAG:
        length = data[position + 1]
        if length < 0x80:
            position += 2
        else:
            length, position = read_varint(data, position + 1)
        stop = position + length
        fields: PointFields | None = None
        if length >= 2 * FIXED64_RECORD:
            tag, second = data[position], data[position + FIXED64_RECORD]
            if tag == _TIME and second == _DOUBLE:
                ns, value = _TIME_DOUBLE(data, position + 1)
                fields = index, data[position + 2 * FIXED64_RECORD : stop], 0, ns, value
            elif tag == _TIME and second == _INT:
                ns, whole = _TIME_INT(data, position + 1)
                fields = index, data[position + 2 * FIXED64_RECORD : stop], 0, ns, float(whole)
            elif tag == _START and second == _TIME and length >= 3 * FIXED64_RECORD:
                third = data[position + 2 * FIXED64_RECORD]
                key = data[position + 3 * FIXED64_RECORD : stop]
                if third == _DOUBLE:
                    start_ns, ns, value = _START_TIME_DOUBLE(data, position + 1)
                    fields = index, key, start_ns, ns, value
                elif third == _INT:
                    start_ns, ns, whole = _START_TIME_INT(data, position + 1)
                    fields = index, key, start_ns, ns, float(whole)
        yield fields if fields is not None else from_object(index, points[index])
        index, position = index + 1, stop
    # Points the walk did not reach (never, for the runtime's encoding): one by one.
    for rest in range(index, count):
        yield from_object(rest, points[rest])


def from_object(index: int, point: NumberDataPoint) -> PointFields:
    """:func:`number_points`' answer for one point, read through the runtime."""
    which = point.WhichOneof("value")
    value = (
        None if which is None else point.as_double if which == "as_double" else float(point.as_int)
    )
    key = attributes_key(point.SerializeToString())
    return index, key, point.start_time_unix_nano, point.time_unix_nano, value


def has_no_time_or_value(key: bytes) -> bool:
    """Whether the records of an attributes key are all of other fields than the time and
    value ones (so that those came from the point's leading records, whole). ``False`` for
    anything that does not parse."""
    position, end = 0, len(key)
    try:
        while position < end:
            tag, position = read_varint(key, position)
            field, wire_type = tag >> 3, tag & 7
            if field in _TIME_FIELDS:
                return False
            if wire_type == 0:
                _, position = read_varint(key, position)
            elif wire_type == 1:
                position += 8
            elif wire_type == 2:
                length, position = read_varint(key, position)
                position += length
            elif wire_type == 5:
                position += 4
            else:  # groups: not in OTLP
                return False
    except IndexError:
        return False
    return position == end


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
