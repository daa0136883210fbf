"""The spool's file format: segments of checksummed records, one submission each.

A segment starts with :data:`MAGIC`; each record is ``<u32 length><u32 crc32><payload>`` and
holds one submission (a project id and its batches). Payload:

    <u32 n><n bytes of JSON: {"p": project_id, "b": [[metric, labels, kind, count], ...]}>
    then, per batch, ``count`` little-endian int64 epoch microseconds and ``count`` float64
    values.

No pickle: a spool file is data, whoever wrote it. A torn or damaged record fails its checksum
(:class:`SpoolCorrupt`), so a segment's good part is the prefix of whole records before it.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from tuneloop.storage.timeseries.columns import Batch, SampleColumns
from tuneloop.storage.timeseries.types import Rejection, RejectionCode, SeriesBatch, SeriesKind

MAGIC = b"TLSPOOL1"

RECORD_HEADER = struct.Struct("<II")  # payload length, crc32 of the payload
_U32 = struct.Struct("<I")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_KINDS = frozenset(kind.value for kind in SeriesKind)
_SWAP = sys.byteorder != "little"  # records are little-endian on every machine


class SpoolCorrupt(Exception):
    """A record failed its checksum or could not be decoded."""


@dataclass(slots=True)
class Encoded:
    """One record ready to append, and what it holds."""

    data: bytes
    samples: int
    rejected: list[Rejection] = field(default_factory=list)


def encode_record(project_id: int, batches: Sequence[Batch]) -> Encoded:
    """The record of one submission. A batch that cannot be represented (wrong types, naive
    timestamps, unequal lengths) is left out and reported as rejected, exactly as the store
    would refuse it; empty batches are left out silently."""
    header: list[list[Any]] = []
    arrays: list[bytes] = []
    rejected: list[Rejection] = []
    samples = 0
    for batch in batches:
        if isinstance(batch, SampleColumns):
            # Every accepted block passes here when the spool is the write-ahead log: in bulk.
            entries, block = _encode_block(batch)
            header.extend(entries)
            arrays.append(block)
            samples += len(batch)
            continue
        encoded = _encode_batch(batch)
        if isinstance(encoded, Rejection):
            rejected.append(encoded)
            continue
        entry, timestamps, values = encoded
        if not entry[3]:
            continue
        header.append(entry)
        arrays.append(timestamps)
        arrays.append(values)
        samples += entry[3]
    if not header:
        return Encoded(b"", 0, rejected)
    meta = json.dumps({"p": project_id, "b": header}, separators=(",", ":")).encode()
    payload = b"".join([_U32.pack(len(meta)), meta, *arrays])
    record = RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload
    return Encoded(record, samples, rejected)


def _encode_block(block: SampleColumns) -> tuple[list[list[Any]], bytes]:
    """The entries and arrays of the batches ``block`` means (see ``SampleColumns.to_batches``:
    table order, column order within a series), laid out as :func:`_encode_batch` lays out
    each batch's: its times, then its values. A block was checked when it was made."""
    counts = block.counts()
    present = np.flatnonzero(counts)
    table = block.table
    entries = [
        [table.metrics[i], dict(table.labels[i]), str(table.kinds[i]), int(counts[i])]
        for i in present.tolist()
    ]
    order = np.argsort(block.series, kind="stable")
    series = block.series[order]
    # Sample j (in series order) of a series whose samples start at s goes to s + j among
    # the times, and its value ``count`` words after it: each series' times, then its values.
    starts = np.cumsum(counts) - counts
    position = starts[series] + np.arange(len(series))
    words = np.empty(2 * len(series), dtype="<i8")
    words[position] = block.micros[order]
    words[position + counts[series]] = block.values[order].view(np.int64)
    return entries, words.tobytes()


def _encode_batch(batch: SeriesBatch) -> tuple[list[Any], bytes, bytes] | Rejection:
    metric, labels, kind = batch.metric, batch.labels, batch.kind
    # Each step names the code of what it checks, so that the one handler below reports it.
    code = RejectionCode.INVALID_BATCH
    try:
        count = len(batch.values)
        if len(batch.timestamps) != count:
            code = RejectionCode.LENGTH_MISMATCH
            raise ValueError("timestamps and values must pair one to one")
        if not isinstance(metric, str):
            code = RejectionCode.INVALID_METRIC
            raise TypeError("metric name must be a string")
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            code = RejectionCode.INVALID_LABELS
            raise TypeError("labels must be a mapping of strings to strings")
        if kind not in _KINDS:
            code = RejectionCode.INVALID_KIND
            raise ValueError(f"unknown kind {kind!r}")
        # Subtracting the epoch raises TypeError for naive datetimes and non-datetimes.
        code = RejectionCode.INVALID_TIMESTAMP
        timestamps = array("q", [(ts - _EPOCH) // _MICROSECOND for ts in batch.timestamps])
        code = RejectionCode.INVALID_VALUE
        values = array("d", batch.values)
    except (TypeError, ValueError, OverflowError) as exc:
        size = _size(batch)
        return Rejection(str(metric), {}, size, f"invalid batch: {exc}", code)
    if _SWAP:
        timestamps.byteswap()
        values.byteswap()
    entry = [metric, dict(labels), str(kind), count]
    return entry, timestamps.tobytes(), values.tobytes()


def decode_record(payload: bytes) -> tuple[int, list[SeriesBatch]]:
    """(project id, batches) of one record's payload (checksum already verified)."""
    try:
        (meta_len,) = _U32.unpack_from(payload, 0)
        meta = json.loads(payload[4 : 4 + meta_len])
        project_id = int(meta["p"])
        position = 4 + meta_len
        batches = []
        for metric, labels, kind, count in meta["b"]:
            width = 8 * count
            timestamps = array("q")
            timestamps.frombytes(payload[position : position + width])
            values = array("d")
            values.frombytes(payload[position + width : position + 2 * width])
            position += 2 * width
            if len(timestamps) != count or len(values) != count:
                raise ValueError("record shorter than its header says")
            if _SWAP:
                timestamps.byteswap()
                values.byteswap()
            batches.append(
                SeriesBatch(
                    metric,
                    labels,
                    [_EPOCH + timedelta(microseconds=us) for us in timestamps],
                    values.tolist(),
                    SeriesKind(kind),
                )
            )
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise SpoolCorrupt(f"undecodable spool record: {exc}") from exc
    return project_id, batches


def _size(batch: SeriesBatch) -> int:
    try:
        return max(len(batch.values), len(batch.timestamps))
    except TypeError:
        return 0


def read_record(file: Any, available: int) -> bytes:
    header = file.read(RECORD_HEADER.size)
    if len(header) < RECORD_HEADER.size or available < RECORD_HEADER.size:
        raise SpoolCorrupt("truncated record header")
    length, crc = RECORD_HEADER.unpack(header)
    if length > available - RECORD_HEADER.size:
        raise SpoolCorrupt("record longer than the segment")
    payload: bytes = file.read(length)
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise SpoolCorrupt("checksum mismatch")
    return payload


def valid_prefix(file: Any, size: int) -> int:
    """Length of the leading part of a segment made of whole, checksummed records."""
    offset = len(MAGIC)
    while offset < size:
        try:
            payload = read_record(file, size - offset)
        except SpoolCorrupt:
            break
        offset += RECORD_HEADER.size + len(payload)
    return offset
