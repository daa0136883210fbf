"""What the tuning loop reads from the time-series store to measure a trial.

Series (docs/step-timing.md; each labelled ``job`` and ``rank``):

- ``tuneloop_samples_per_second``: one point per step and rank. The job's throughput is the
  per-rank mean times the number of ranks seen (data-parallel ranks step in lockstep).
- ``tuneloop_step_duration_seconds``: seconds per step (the ``step_time`` objective).
- ``tuneloop_gradient_noise_scale``: the gradient noise scale phi the job's agent estimates
  (gauge; the goodput objective's statistical efficiency).
- ``tuneloop_request_duration_seconds``: a latency histogram (``_bucket{le}`` counters) of an
  inference service, for the P99 of ``slo_throughput``.

Reads go through the query layer (``query_range`` with per-second buckets, ``latest``,
``histogram_quantile``); nothing here decides anything.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import Connection, Engine

from tuneloop.step_timing import SAMPLES_PER_SECOND, STEP_DURATION
from tuneloop.storage.timeseries.functions import histogram_quantile
from tuneloop.storage.timeseries.query import TooManySeries, find_series, query_range
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp
from tuner.measurement import Sample

Bind = Engine | Connection

THROUGHPUT_METRIC: Final = SAMPLES_PER_SECOND
STEP_TIME_METRIC: Final = STEP_DURATION
NOISE_SCALE_METRIC: Final = "tuneloop_gradient_noise_scale"
LATENCY_HISTOGRAM: Final = "tuneloop_request_duration_seconds"
RANK_LABEL: Final = "rank"
_ONE_SECOND: Final = timedelta(seconds=1)
MAX_POINTS: Final = 2_000
"""Buckets per window at most: enough for batch means, few enough to read every tick."""


def primary_metric(objective: str) -> str:
    """The step-timing series a trial of ``objective`` is judged on."""
    return STEP_TIME_METRIC if objective == "step_time" else THROUGHPUT_METRIC


def job_matchers(job_name: str) -> list[Matcher]:
    return [Matcher("job", MatchOp.EQ, job_name)]


def has_series(bind: Bind, project_id: int, job_name: str, metric: str) -> bool:
    try:
        return bool(find_series(bind, project_id, metric, job_matchers(job_name), max_series=1))
    except TooManySeries:  # more than one: there is data
        return True


def rank_count(bind: Bind, project_id: int, job_name: str) -> int:
    """Distinct ranks with throughput series (0 when the job has none)."""
    series = find_series(bind, project_id, THROUGHPUT_METRIC, job_matchers(job_name))
    return len({info.labels.get(RANK_LABEL, "0") for info in series})


def _step_s(start: datetime, end: datetime) -> int:
    return max(1, math.ceil((end - start).total_seconds() / MAX_POINTS))


def window_samples(
    bind: Bind,
    project_id: int,
    job_name: str,
    metric: str,
    *,
    start: datetime,
    end: datetime,
    per_job: bool,
) -> list[Sample]:
    """One :class:`Sample` per bucket of ``[start, end)``: the mean over ranks of each rank's
    bucket mean, times the ranks seen in the window when ``per_job`` (a throughput), else as
    is (a step time). Sample times are bucket starts in epoch seconds."""
    if end <= start:
        return []
    step_s = _step_s(start, end)
    found = query_range(
        bind,
        project_id,
        metric,
        job_matchers(job_name),
        start=start,
        end=end,
        step_s=step_s,
        aggregation=Aggregation.AVG,
    )
    ranks = {series.series.labels.get(RANK_LABEL, "0") for series in found}
    by_bucket: dict[datetime, list[float]] = defaultdict(list)
    for series in found:
        for ts, value in series.points:
            by_bucket[ts].append(value)
    scale = float(len(ranks)) if per_job else 1.0
    return [
        # The bucket's end: a sample is only as fresh as the last step it may hold.
        Sample(ts.timestamp() + step_s, scale * sum(values) / len(values))
        for ts, values in sorted(by_bucket.items())
    ]


def window_mean(
    bind: Bind, project_id: int, job_name: str, metric: str, *, start: datetime, end: datetime
) -> float | None:
    """Mean of every sample of the job's ``metric`` series in ``[start, end)``, or ``None``."""
    points = window_samples(bind, project_id, job_name, metric, start=start, end=end, per_job=False)
    values = [s.value for s in points if math.isfinite(s.value)]
    return sum(values) / len(values) if values else None


def latency_quantile(
    bind: Bind, project_id: int, job_name: str, q: float, *, start: datetime, end: datetime
) -> float | None:
    """The ``q``-quantile of the requests observed in ``[start, end)`` (whole seconds, ending
    at the bucket holding ``end``), all label sets of the job pooled; ``None`` without data."""
    window_s = max(1, math.ceil((end - start).total_seconds()))
    groups = histogram_quantile(
        bind,
        project_id,
        q,
        LATENCY_HISTOGRAM,
        job_matchers(job_name),
        start=end.replace(microsecond=0),
        end=end.replace(microsecond=0) + _ONE_SECOND,
        step_s=1,
        window_s=window_s,
    )
    values = _finite_last_points(groups_points=[g.points for g in groups])
    # Several label sets (instances): the worst one decides whether the SLO holds.
    return max(values) if values else None


def _finite_last_points(groups_points: Sequence[Sequence[tuple[datetime, float]]]) -> list[float]:
    return [points[-1][1] for points in groups_points if points and math.isfinite(points[-1][1])]
