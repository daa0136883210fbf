"""A Prometheus-compatible TSDB (Prometheus with its remote-write receiver, VictoriaMetrics, ...)
as a :class:`~tuneloop.storage.timeseries.backend.TimeSeriesBackend`.

Writes are remote-write requests whose series carry ``<project_label>="<project id>"``; reads
are PromQL over the HTTP API with that matcher added, and the label taken off the answer, so a
project sees only its own series. The contract's semantics and this backend's tolerances are in
:mod:`tuneloop.storage.timeseries.backend`; the PromQL is built in
:mod:`tuneloop.storage.prometheus.queries`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from tuneloop.storage.prometheus import queries, raw_reads
from tuneloop.storage.prometheus.client import DEFAULT_TIMEOUT_S, PrometheusClient
from tuneloop.storage.prometheus.grid import Buckets, Windows
from tuneloop.storage.prometheus.remote_writer import RemoteWriter
from tuneloop.storage.timeseries.columns import Batch, expand
from tuneloop.storage.timeseries.functions import BUCKET_LABEL, BUCKET_SUFFIX, LabeledSeries
from tuneloop.storage.timeseries.query import METRIC_LABEL, TooManySeries
from tuneloop.storage.timeseries.query_checks import check_query
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.types import (
    Aggregation,
    LatestSample,
    Matcher,
    MatchOp,
    RangeSeries,
    Rejection,
    RejectionCode,
    SeriesBatch,
    SeriesInfo,
    WriteResult,
)
from tuneloop.storage.timeseries.write_validation import Accepted, Identity, validate_batch
from tuneloop.storage.types import from_micros, utcnow

Points = dict[tuple[tuple[str, str], ...], list[tuple[datetime, float]]]


class PrometheusBackend:
    """Series of every project in the TSDB at ``url`` (remote write at ``write_url``, default
    ``<url>/api/v1/write``, the HTTP API at ``<url>/api/v1/...``)."""

    def __init__(
        self,
        url: str,
        *,
        write_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        project_label: str = queries.PROJECT_LABEL,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.client = PrometheusClient(url, headers=headers, timeout_s=timeout_s)
        self.writer = RemoteWriter(
            write_url or f"{self.client.url}/api/v1/write",
            headers=headers,
            timeout_s=timeout_s,
            project_label=project_label,
        )
        self.project_label = project_label
        self._clock = clock

    def close(self) -> None:
        self.client.close()
        self.writer.close()

    # ----------------------------------------------------------------------- write

    def write(self, project_id: int, batches: Iterable[Batch]) -> WriteResult:
        """The store's batch checks (the same rejections; NaN dropped; the project label
        reserved), each series' batches merged into time order, once per millisecond (the
        first sample wins, as the store keeps the first): Prometheus drops samples older than
        a series' newest, even within one request. Then :class:`RemoteWriter`: a request the
        TSDB refuses is a ``remote_rejected`` rejection with its reason; one it cannot take
        now raises ``RemoteWriteUnavailable`` (:class:`~tuneloop.errors.Unavailable`)."""
        result = WriteResult()
        identities: dict[tuple[object, ...], Identity] = {}
        by_series: dict[str, tuple[Accepted, dict[int, float]]] = {}
        for batch in expand(list(batches)):
            if isinstance(batch.labels, Mapping) and self.project_label in batch.labels:
                result.rejected.append(self._reserved(batch.metric, batch.labels, batch.values))
                continue
            accepted = validate_batch(batch, result, identities)
            if accepted is None:
                continue
            _, samples = by_series.setdefault(accepted.fingerprint, (accepted, {}))
            for ts, value in zip(accepted.timestamps, accepted.values, strict=True):
                samples.setdefault(queries.to_millis(ts), value)
        merged = [
            SeriesBatch(
                first.metric,
                first.labels,
                [from_micros(ms * 1000) for ms in sorted(samples)],
                [samples[ms] for ms in sorted(samples)],
                first.kind,
            )
            for first, samples in by_series.values()
        ]
        sent = self.writer.write(project_id, merged)
        result.samples_written = sent.samples_written
        result.rejected.extend(sent.rejected)
        return result

    def _reserved(self, metric: str, labels: Mapping[str, str], values: Any) -> Rejection:
        try:
            samples = len(values)
        except TypeError:
            samples = 0
        return Rejection(
            str(metric),
            labels,
            samples,
            f"label {self.project_label!r} is reserved: it names the project in the TSDB",
            RejectionCode.INVALID_LABELS,
        )

    # ----------------------------------------------------------------------- series and labels

    def find_series(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        max_series: int | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[SeriesInfo]:
        """Series with samples in ``[start, end]``; without ``start``, in the last
        :data:`~queries.DEFAULT_LOOKBACK_S` (a TSDB forgets series only with their samples)."""
        return self._series(project_id, metric, matchers, start, end, max_series)

    def _series(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher],
        start: datetime | None,
        end: datetime | None,
        max_series: int | None,
    ) -> list[SeriesInfo]:
        sel = self._selector(project_id, metric, matchers)
        params = [("match[]", sel), *self._range_params(start, end)]
        if max_series is not None:
            params.append(("limit", str(max_series + 1)))  # VictoriaMetrics stops there
        found = {
            info.id: info
            for info in (
                queries.series_info(
                    raw.get(METRIC_LABEL, ""), queries.own_labels(raw, self.project_label)
                )
                for raw in self.client.api("series", params)
            )
        }
        if max_series is not None and len(found) > max_series:
            raise TooManySeries(max_series)
        return sorted(found.values(), key=lambda info: (info.metric, info.id))

    def label_names(
        self,
        project_id: int,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[str]:
        params = [("match[]", self._selector(project_id, None, matchers))]
        names = self.client.api("labels", [*params, *self._range_params(start, end)])
        return sorted(name for name in names if name != self.project_label)

    def label_values(
        self,
        project_id: int,
        name: str,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[str]:
        if name == self.project_label:
            return []
        if name != METRIC_LABEL:
            # Only series that have the label: as the store, which lists no empty values.
            matchers = (*matchers, Matcher(name, MatchOp.NE, ""))
        params = [("match[]", self._selector(project_id, None, matchers))]
        values = self.client.api(
            f"label/{quote(name, safe='')}/values",
            [*params, *self._range_params(start, end)],
            method="GET",
        )
        return sorted(values)

    # ----------------------------------------------------------------------- range queries

    def query_range(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime,
        end: datetime,
        step_s: int,
        aggregation: Aggregation,
        q: float | None = None,
        max_series: int | None = None,
    ) -> list[RangeSeries]:
        aggregation = Aggregation(aggregation)
        check_query(start, end, step_s, aggregation, q)
        buckets = Buckets.of(start, end, step_s)
        out: list[RangeSeries] = []
        for name in self._metrics(project_id, metric, matchers, start, end, max_series):
            sel = self._selector(project_id, name, matchers)
            points: Points = {}
            full = buckets.full
            if full is not None:
                expression = queries.over_time(aggregation, sel, buckets.step_ms, q)
                self._range_into(points, expression, full, step_s, -buckets.step_ms)
            for edge in buckets.edges:
                expression = queries.over_time(aggregation, sel, edge.window_ms, q)
                self._instant_into(points, expression, edge.eval_ms, edge.label_ms)
            out.extend(_range_series(name, points))
        return out

    def rate(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime,
        end: datetime,
        step_s: int,
        window_s: int | None = None,
        max_series: int | None = None,
    ) -> list[RangeSeries]:
        return self._counter(
            "rate", project_id, metric, matchers, start, end, step_s, window_s, max_series
        )

    def increase(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime,
        end: datetime,
        step_s: int,
        window_s: int | None = None,
        max_series: int | None = None,
    ) -> list[RangeSeries]:
        return self._counter(
            "increase", project_id, metric, matchers, start, end, step_s, window_s, max_series
        )

    def _counter(
        self,
        function: str,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher],
        start: datetime,
        end: datetime,
        step_s: int,
        window_s: int | None,
        max_series: int | None,
    ) -> list[RangeSeries]:
        windows = Windows.of(start, end, step_s, window_s)
        out: list[RangeSeries] = []
        names = self._metrics(
            project_id, metric, matchers, windows.read_from, windows.read_to, max_series
        )
        for name in names:
            sel = self._selector(project_id, name, matchers)
            points: Points = {}
            expression = queries.counter(function, sel, windows.window_s)
            self._range_into(points, expression, windows.evaluations, step_s, -step_s * 1000)
            out.extend(_range_series(name, points))
        return out

    def histogram_quantile(
        self,
        project_id: int,
        q: float,
        metric: str,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime,
        end: datetime,
        step_s: int,
        window_s: int | None = None,
        max_series: int | None = None,
        by: Sequence[str] | None = None,
    ) -> list[LabeledSeries]:
        windows = Windows.of(start, end, step_s, window_s)
        bucket_metric = metric + BUCKET_SUFFIX
        self._series(
            project_id, bucket_metric, matchers, windows.read_from, windows.read_to, max_series
        )
        sel = self._selector(project_id, bucket_metric, matchers)
        increases = queries.counter("increase", sel, windows.window_s)
        if by is not None:
            grouping = ", ".join(queries.label_name(name) for name in (*by, BUCKET_LABEL))
            increases = f"sum by ({grouping}) ({increases})"
        # Buckets whose le is no number are left out by the TSDB, as by the store.
        expression = f"histogram_quantile({float(q)!r}, {increases})"
        points: Points = {}
        self._range_into(points, expression, windows.evaluations, step_s, -step_s * 1000)
        return [
            LabeledSeries({k: v for k, v in key if k != BUCKET_LABEL}, sorted(values))
            for key, values in sorted(points.items())
        ]

    # ----------------------------------------------------------------------- raw samples

    def read_raw(
        self,
        project_id: int,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        *,
        max_series: int | None = None,
    ) -> list[RawSeries]:
        return raw_reads.read(
            self.client, self.project_label, project_id, matchers, start_ms, end_ms, max_series
        )

    def count_raw(
        self, project_id: int, matchers: Sequence[Matcher], start_ms: int, end_ms: int, limit: int
    ) -> int:
        return raw_reads.count(
            self.client, self.project_label, project_id, matchers, start_ms, end_ms, limit
        )

    # ----------------------------------------------------------------------- latest

    def latest(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        since: datetime | None = None,
        max_series: int | None = None,
    ) -> list[LatestSample]:
        """Newest samples up to now; see the module docstring of the contract for the lookback
        when ``since`` is ``None``. Value and time are two instant queries at one evaluation
        time: a sample stamped before it that lands between them pairs its time with the
        previous value, until the next call."""
        if since is not None and since.tzinfo is None:
            raise ValueError("naive datetime: tuneloop timestamps must be timezone-aware")
        now_ms = queries.to_millis(self._clock())
        since_ms = now_ms - queries.DEFAULT_LOOKBACK_S * 1000
        if since is not None:
            since_ms = queries.to_millis(since)
        if since_ms > now_ms:
            return []
        lookback_ms = now_ms - since_ms + 1  # the window includes the sample at ``since``
        out: list[LatestSample] = []
        read_from = queries.from_seconds(since_ms / 1000)
        for name in self._metrics(project_id, metric, matchers, read_from, None, None):
            sel = self._selector(project_id, name, matchers)
            values = self._vector(f"last_over_time({sel}[{queries.duration(lookback_ms)}])", now_ms)
            times = self._vector(queries.latest_time(sel, lookback_ms), now_ms)
            for key, value in values.items():
                if key in times:
                    info = queries.series_info(name, dict(key))
                    out.append(LatestSample(info, queries.from_seconds(times[key]), value))
        if max_series is not None and len(out) > max_series:
            raise TooManySeries(max_series)
        return sorted(out, key=lambda sample: (sample.series.metric, sample.series.id))

    # ----------------------------------------------------------------------- helpers

    def _selector(self, project_id: int, metric: str | None, matchers: Sequence[Matcher]) -> str:
        return queries.selector(self.project_label, project_id, metric, matchers)

    def _range_params(self, start: datetime | None, end: datetime | None) -> list[tuple[str, str]]:
        if start is None:
            start = self._clock() - timedelta(seconds=queries.DEFAULT_LOOKBACK_S)
        params = [("start", queries.unix_seconds(start))]
        if end is not None:
            params.append(("end", queries.unix_seconds(end)))
        return params

    def _metrics(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher],
        start: datetime | None,
        end: datetime | None,
        max_series: int | None,
    ) -> list[str]:
        """The metric names a read covers, one query each (``*_over_time`` drops the name).
        Checks ``max_series`` before any sample is read, as the store does."""
        if metric is not None and max_series is None:
            return [metric]
        found = self._series(project_id, metric, matchers, start, end, max_series)
        return sorted({info.metric for info in found})

    def _key(self, raw: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(queries.own_labels(raw, self.project_label).items()))

    def _range_into(
        self,
        points: Points,
        expression: str,
        evaluations: tuple[int, int],
        step_s: int,
        shift_ms: int,
    ) -> None:
        first_ms, last_ms = evaluations
        params = [
            ("query", expression),
            ("start", queries.unix_seconds(first_ms)),
            ("end", queries.unix_seconds(last_ms)),
            ("step", f"{step_s}s"),
            ("nocache", "1"),  # VictoriaMetrics: no cache that aligns or delays points
        ]
        for item in self.client.api("query_range", params)["result"]:
            found = points.setdefault(self._key(item["metric"]), [])
            for seconds, value in item["values"]:
                label_ms = round(float(seconds) * 1000) + shift_ms
                found.append((queries.from_seconds(label_ms / 1000), float(value)))

    def _instant_into(self, points: Points, expression: str, eval_ms: int, label_ms: int) -> None:
        for key, value in self._vector(expression, eval_ms).items():
            points.setdefault(key, []).append((queries.from_seconds(label_ms / 1000), value))

    def _vector(self, expression: str, eval_ms: int) -> dict[tuple[tuple[str, str], ...], float]:
        params = [("query", expression), ("time", queries.unix_seconds(eval_ms)), ("nocache", "1")]
        data = self.client.api("query", params)
        return {self._key(item["metric"]): float(item["value"][1]) for item in data["result"]}


def _range_series(metric: str, points: Points) -> list[RangeSeries]:
    return [
        RangeSeries(queries.series_info(metric, dict(key)), sorted(values))
        for key, values in points.items()
        if values
    ]
