"""Raw samples out of a Prometheus-compatible TSDB, for an engine that evaluates PromQL itself
(:mod:`tuneloop.promql`): an instant query of the range selector ``{<matchers>,
<project label>="<id>"}[<end - start>]`` at ``end`` answers each series' samples with their
own timestamps (a matrix), as Prometheus and VictoriaMetrics both do.

Prometheus 2 answers the closed window ``[start, end]``, later versions and VictoriaMetrics
``(start, end]``: the sample at ``start`` is dropped here, so every TSDB gives the store's
half-open window.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuneloop.storage.prometheus import queries
from tuneloop.storage.prometheus.client import PrometheusClient, TsdbRefused
from tuneloop.storage.timeseries.query import TooManySeries
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.types import Matcher


def _range_selector(
    project_label: str, project_id: int, matchers: Sequence[Matcher], ms: int
) -> str:
    sel = queries.selector(project_label, project_id, None, matchers)
    return f"{sel}[{queries.duration(ms)}]"


def read(
    client: PrometheusClient,
    project_label: str,
    project_id: int,
    matchers: Sequence[Matcher],
    start_ms: int,
    end_ms: int,
    max_series: int | None,
) -> list[RawSeries]:
    """Each selected series (``__name__`` among its labels, the project label taken off) with
    its samples in ``(start_ms, end_ms]``, oldest first; series without one left out."""
    if end_ms <= start_ms:
        return []
    expression = _range_selector(project_label, project_id, matchers, end_ms - start_ms)
    params = [("query", expression), ("time", queries.unix_seconds(end_ms)), ("nocache", "1")]
    data = client.api("query", params)
    out: list[RawSeries] = []
    for item in data["result"]:
        times = np.array([round(float(t) * 1000) for t, _ in item["values"]], dtype=np.int64)
        values = np.array([float(v) for _, v in item["values"]], dtype=np.float64)
        keep = times > start_ms
        if not keep.any():
            continue
        labels = {k: v for k, v in item["metric"].items() if k != project_label}
        out.append(RawSeries(labels, times[keep], values[keep]))
        if max_series is not None and len(out) > max_series:
            raise TooManySeries(max_series)
    out.sort(key=lambda series: sorted(series.labels.items()))
    return out


def count(
    client: PrometheusClient,
    project_label: str,
    project_id: int,
    matchers: Sequence[Matcher],
    start_ms: int,
    end_ms: int,
    limit: int,
) -> int:
    """Samples :func:`read` would load, at most ``limit + 1``: one ``count_over_time`` summed
    in the TSDB (which may count the sample at ``start`` too: a bound, not a tally). Series of
    several names with one label set make that refused (``count_over_time`` drops the name),
    and are then counted by reading them."""
    if end_ms <= start_ms:
        return 0
    ranged = _range_selector(project_label, project_id, matchers, end_ms - start_ms)
    expression = f"sum(count_over_time({ranged}))"
    params = [("query", expression), ("time", queries.unix_seconds(end_ms)), ("nocache", "1")]
    try:
        result = client.api("query", params)["result"]
    except TsdbRefused:
        found = read(client, project_label, project_id, matchers, start_ms, end_ms, None)
        return min(sum(len(series.times_ms) for series in found), limit + 1)
    total = round(float(result[0]["value"][1])) if result else 0
    return min(total, limit + 1)
