"""Writes batches into a Prometheus-compatible TSDB over remote write 1.0.

Per the remote-write spec, what a failure means is decided by the status alone: a connection
error, 5xx or 429 is temporary (:class:`RemoteWriteUnavailable`, nothing of the failed request
was kept; retry it), any other 4xx is permanent for that request's samples (reported as
rejections, never retried). A write larger than ``max_samples_per_request`` goes out as several
requests, in order; if one of them fails temporarily, the ones before it were kept, so a retry
of the whole write sends those again: delivery is at least once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np

from tuneloop import remote_write
from tuneloop.errors import Unavailable
from tuneloop.remote_write import RemoteSeries
from tuneloop.storage.timeseries.columns import Batch, SampleColumns
from tuneloop.storage.timeseries.types import Rejection, RejectionCode, WriteResult

PROJECT_LABEL: Final = "tuneloop_project"
MAX_SAMPLES_PER_REQUEST: Final = 10_000
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_RETRYABLE_STATUS: Final = frozenset({429})


class RemoteWriteUnavailable(Unavailable):
    """The TSDB could not be reached or asked to retry (5xx, 429); nothing of the failed
    request was kept."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class RemoteWriter:
    """A keep-alive client of one remote-write URL. Safe to share between threads."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        project_label: str = PROJECT_LABEL,
        max_samples_per_request: int = MAX_SAMPLES_PER_REQUEST,
    ) -> None:
        if max_samples_per_request < 1:
            raise ValueError("max_samples_per_request must be >= 1")
        self.url = url
        self.project_label = project_label
        self.max_samples_per_request = max_samples_per_request
        self._client = httpx.Client(
            headers={**remote_write.HEADERS, **(headers or {})}, timeout=timeout_s
        )

    def close(self) -> None:
        self._client.close()

    def write(self, project_id: int, batches: Sequence[Batch]) -> WriteResult:
        """Send ``batches`` as ``project_id``'s series (label ``project_label``). NaN values
        are left out, as the tuneloop store leaves them out; a 4xx answer is reported as the
        rejection of that request's samples. Raises :class:`RemoteWriteUnavailable`."""
        bodies, result = self.requests(project_id, batches)
        for body, samples in bodies:
            refused = self._send(body)
            if refused is None:
                result.samples_written += samples
            else:
                result.rejected.append(
                    Rejection("", {}, samples, refused, RejectionCode.REMOTE_REJECTED)
                )
        return result

    def requests(
        self, project_id: int, batches: Sequence[Batch]
    ) -> tuple[list[tuple[bytes, int]], WriteResult]:
        """The bodies :meth:`write` sends for ``batches``, each with its sample count, and
        what it leaves out (NaN, invalid batches) as rejections."""
        result = WriteResult()
        extra = {self.project_label: str(project_id)}
        series = [item for batch in batches for item in _series_of(batch, extra, result)]
        bodies = [
            (remote_write.encode(chunk), sum(len(item.values) for item in chunk))
            for chunk in _chunks(series, self.max_samples_per_request)
        ]
        return bodies, result

    def _send(self, body: bytes) -> str | None:
        """POST one request; ``None`` if kept, else why the TSDB refused it for good."""
        try:
            response = self._client.post(self.url, content=body)
        except httpx.HTTPError as exc:
            raise RemoteWriteUnavailable(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        if response.is_success:
            return None
        text = response.text.strip().splitlines()[0][:300] if response.text.strip() else ""
        message = f"{self.url} answered {response.status_code}: {text}"
        if response.status_code >= 500 or response.status_code in _RETRYABLE_STATUS:
            raise RemoteWriteUnavailable(message, _retry_after(response))
        return message


def without_credentials(url: str) -> str:
    """``url`` less any user and password: what may be logged or shown."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


def _series_of(
    batch: Batch, extra: Mapping[str, str], result: WriteResult
) -> Iterator[RemoteSeries]:
    if isinstance(batch, SampleColumns):
        yield from _columns_series(batch, extra, result)
        return
    try:
        millis = [(ts - _EPOCH) // _MS for ts in batch.timestamps]
        values = [float(value) for value in batch.values]
        if len(millis) != len(values) or not isinstance(batch.metric, str) or not batch.metric:
            raise ValueError("not a series' batch")
        labels = {**batch.labels, **extra}
    except (TypeError, ValueError, AttributeError):
        result.rejected.append(
            Rejection(str(batch.metric), {}, 0, "invalid batch", RejectionCode.INVALID_BATCH)
        )
        return
    kept = [i for i, value in enumerate(values) if not math.isnan(value)]
    if len(kept) < len(values):
        _nan(batch.metric, len(values) - len(kept), result)
        millis = [millis[i] for i in kept]
        values = [values[i] for i in kept]
    if values:
        yield remote_write.series(batch.metric, labels, millis, values)


def _columns_series(
    columns: SampleColumns, extra: Mapping[str, str], result: WriteResult
) -> Iterator[RemoteSeries]:
    order = np.argsort(columns.series, kind="stable")
    counts = columns.counts().tolist()
    sorted_values = columns.values[order]
    nan = np.isnan(sorted_values)
    if nan.any():  # rare: looked at series by series only then
        keep = ~nan
        counts = np.bincount(columns.series[order][keep], minlength=len(counts)).tolist()
        for index, dropped in enumerate(np.bincount(columns.series[order][nan]).tolist()):
            if dropped:
                _nan(columns.table.metrics[index], dropped, result)
        order, sorted_values = order[keep], sorted_values[keep]
    millis = (columns.micros[order] // 1000).tolist()
    values = sorted_values.tolist()
    table = columns.table
    start = 0
    for index, count in enumerate(counts):
        if not count:
            continue
        stop = start + count
        labels = {**table.labels[index], **extra}
        yield remote_write.series(
            table.metrics[index], labels, millis[start:stop], values[start:stop]
        )
        start = stop


def _nan(metric: str, count: int, result: WriteResult) -> None:
    result.rejected.append(
        Rejection(metric, {}, count, "NaN values are not kept", RejectionCode.NAN_VALUE)
    )


def _chunks(series: Sequence[RemoteSeries], limit: int) -> Iterator[list[RemoteSeries]]:
    """Requests of at most ``limit`` samples, series split where they must be."""
    chunk: list[RemoteSeries] = []
    size = 0
    for item in series:
        offset = 0
        while offset < len(item.values):
            take = min(limit - size, len(item.values) - offset)
            chunk.append(
                RemoteSeries(
                    item.labels,
                    item.timestamps_ms[offset : offset + take],
                    item.values[offset : offset + take],
                )
            )
            offset += take
            size += take
            if size == limit:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk
