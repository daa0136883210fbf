"""What only a Prometheus-compatible TSDB does on write: the project label is reserved, times
are kept to the millisecond, and a request the TSDB refuses is a rejection with its reason."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from tests.peers import flush_victoria_metrics
from tests.timeseries_contract.conftest import T0
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.types import Aggregation, RejectionCode, SeriesBatch

TSDBS = ["victoriametrics", "prometheus"]


def backend_for(tsdb: str, request: pytest.FixtureRequest) -> tuple[PrometheusBackend, str]:
    url: str = request.getfixturevalue(
        "victoria_metrics_url" if tsdb == "victoriametrics" else "prometheus_url"
    )
    return PrometheusBackend(url), url


@pytest.mark.parametrize("tsdb", TSDBS)
def test_the_project_label_is_reserved_and_times_are_milliseconds(
    tsdb: str, request: pytest.FixtureRequest
) -> None:
    backend, url = backend_for(tsdb, request)
    project = random.randrange(100_000_000, 999_999_999)  # the TSDB is shared
    try:
        result = backend.write(
            project,
            [
                SeriesBatch("tl_m", {"tuneloop_project": "1"}, [T0], [1.0]),
                SeriesBatch("tl_m", {"ok": "1"}, [T0 + timedelta(microseconds=1_500)], [2.0]),
            ],
        )
        assert [r.code for r in result.rejected] == [RejectionCode.INVALID_LABELS]
        assert "reserved" in result.rejected[0].reason
        assert result.samples_written == 1
        if tsdb == "victoriametrics":
            flush_victoria_metrics(url)
        (newest,) = backend.latest(project, "tl_m", since=T0)
        assert newest.ts == T0 + timedelta(milliseconds=1)
        assert dict(newest.series.labels) == {"ok": "1"}
    finally:
        backend.close()


def test_prometheus_refusing_old_samples_is_a_rejection_with_its_reason(
    request: pytest.FixtureRequest,
) -> None:
    backend, _ = backend_for("prometheus", request)
    try:
        # Far older than Prometheus' head block takes: out of bounds.
        old = T0 - timedelta(days=30)
        result = backend.write(1, [SeriesBatch("tl_old", {}, [old], [1.0])])
        assert result.samples_written == 0
        (refused,) = result.rejected
        assert refused.code == RejectionCode.REMOTE_REJECTED
        assert "out of bounds" in refused.reason
    finally:
        backend.close()


def test_prometheus_refusing_out_of_order_samples_is_a_rejection(
    request: pytest.FixtureRequest,
) -> None:
    backend, _ = backend_for("prometheus", request)
    project = random.randrange(100_000_000, 999_999_999)
    try:
        backend.write(project, [SeriesBatch("tl_late", {}, [T0 + timedelta(seconds=10)], [1.0])])
        late = backend.write(project, [SeriesBatch("tl_late", {}, [T0], [2.0])])
        assert [r.code for r in late.rejected] == [RejectionCode.REMOTE_REJECTED]
        assert "out of order" in late.rejected[0].reason
        # Within one write, a series' batches are merged into time order: nothing is lost.
        backend.write(
            project,
            [
                SeriesBatch("tl_merged", {}, [T0 + timedelta(seconds=2)], [2.0]),
                SeriesBatch("tl_merged", {}, [T0 + timedelta(seconds=1)], [1.0]),
            ],
        )
        (answer,) = backend.query_range(
            project,
            "tl_merged",
            start=T0,
            end=T0 + timedelta(minutes=1),
            step_s=60,
            aggregation=Aggregation.COUNT,
        )
        assert answer.points == [(T0, 2.0)]
    finally:
        backend.close()
