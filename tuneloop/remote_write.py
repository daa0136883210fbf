"""The Prometheus remote-write 1.0 protocol: a ``WriteRequest`` in protobuf, compressed with
snappy's block format, POSTed with the headers below. One codec for both directions: the
receiver (``POST /api/v1/write``) decodes, the forwarding sink and the Prometheus-compatible
backend encode.

The messages are the generated ``prompb`` ones that OpenTelemetry's remote-write exporter ships;
snappy is cramjam's. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import cramjam
from google.protobuf.message import DecodeError
from opentelemetry.exporter.prometheus_remote_write.gen import remote_pb2, types_pb2

METRIC_NAME_LABEL = "__name__"
VERSION = "0.1.0"
HEADERS: Mapping[str, str] = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": VERSION,
    "User-Agent": "tuneloop",
}
# What one request may decode to, whatever its compressed size: snappy states the decoded
# length up front, so a small body cannot make the server allocate gigabytes.
DEFAULT_MAX_DECODED_BYTES = 64 * 1024 * 1024


class RemoteWriteError(ValueError):
    """A body that is not a remote-write request (bad snappy, bad protobuf, too large): a
    Prometheus receiver answers 400 and keeps nothing of it."""


@dataclass(frozen=True, slots=True)
class RemoteSeries:
    """One series of a write request: its labels (``__name__`` among them, as on the wire, in
    wire order, duplicates kept so a receiver can refuse them) and its samples, timestamps in
    milliseconds since the epoch."""

    labels: Sequence[tuple[str, str]]
    timestamps_ms: Sequence[int]
    values: Sequence[float]

    @property
    def metric(self) -> str:
        return next((value for name, value in self.labels if name == METRIC_NAME_LABEL), "")

    def label_map(self) -> dict[str, str]:
        """The labels without ``__name__``; the last of duplicated names wins (a receiver
        checks :func:`duplicate_label` first)."""
        return {name: value for name, value in self.labels if name != METRIC_NAME_LABEL}


def series(
    metric: str,
    labels: Mapping[str, str],
    timestamps_ms: Sequence[int],
    values: Sequence[float],
) -> RemoteSeries:
    """A series as a sender builds it: ``__name__`` first, the other labels sorted by name, as
    the protocol asks."""
    ordered = [(METRIC_NAME_LABEL, metric), *sorted(labels.items())]
    return RemoteSeries(ordered, timestamps_ms, values)


def encode(write: Iterable[RemoteSeries]) -> bytes:
    """The compressed body of one write request."""
    request = remote_pb2.WriteRequest()
    for item in write:
        proto = request.timeseries.add()
        proto.labels.extend(types_pb2.Label(name=n, value=v) for n, v in item.labels)
        proto.samples.extend(
            types_pb2.Sample(value=value, timestamp=ts)
            for ts, value in zip(item.timestamps_ms, item.values, strict=True)
        )
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def decode(
    body: bytes, *, max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
) -> list[RemoteSeries]:
    """The series of a compressed write request. Raises :class:`RemoteWriteError` naming what
    is wrong."""
    try:
        decoded_length = cramjam.snappy.decompress_raw_len(body)
    except cramjam.DecompressionError as exc:
        raise RemoteWriteError(f"snappy decode error: {exc}") from exc
    if decoded_length > max_decoded_bytes:
        raise RemoteWriteError(
            f"decoded body of {decoded_length} bytes exceeds the limit of {max_decoded_bytes}"
        )
    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise RemoteWriteError(f"snappy decode error: {exc}") from exc
    request = remote_pb2.WriteRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise RemoteWriteError(f"protobuf decode error: {exc}") from exc
    return [
        RemoteSeries(
            [(label.name, label.value) for label in proto.labels],
            [sample.timestamp for sample in proto.samples],
            [sample.value for sample in proto.samples],
        )
        for proto in request.timeseries
    ]


def duplicate_label(item: RemoteSeries) -> str | None:
    """The first label name that occurs twice in the series, or ``None``."""
    seen: set[str] = set()
    for name, _ in item.labels:
        if name in seen:
            return name
        seen.add(name)
    return None
