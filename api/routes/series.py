"""Reads of a project's time series, in Prometheus' result shapes::

    curl -G -H "Authorization: Bearer $TOKEN" localhost:8000/api/v1/projects/vision/query_range \\
        --data-urlencode metric=tokens_total --data-urlencode 'match=job=~"train.*"' \\
        --data-urlencode start=2024-03-01T12:00:00Z --data-urlencode end=1709298000 \\
        --data-urlencode step=1m --data-urlencode agg=rate
    {"resultType": "matrix", "result": [{"metric": {"__name__": "tokens_total", "job": "train-1"},
                                         "values": [[1709294400, "1523.5"], ...]}]}

``/series`` lists series, ``/query_range`` aggregates per step (``agg``: avg, min, max, sum,
count, last, quantile with ``q``, rate, increase with an optional ``window``),
``/query/latest`` gives the newest sample per series and ``/histogram_quantile`` quantiles of
a classic histogram per step. Every role of the project may read.

Series are selected by ``metric`` and repeated ``match`` parameters, each one PromQL label
matcher (``match=gpu="0"&match=job=~"train.*"``). Malformed parameters get 422 with the
parameter and the reason; so do queries the store refuses (more than
``MAX_POINTS_PER_SERIES`` points per series, more than ``MAX_SERIES_PER_RESPONSE`` series, a
read past ``READ_TIMEOUT_S``). A read stops when its client disconnects (api/read_limits.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError

from api.deps import API_PREFIX, AUTH_ERRORS, ProjectDep, RuntimeDep, SessionDep
from api.query_params import duration_param, matchers_param, time_param
from api.read_limits import ClientWatchDep, bounded_read
from api.schemas.common import ErrorOut
from api.schemas.series import MatrixOut, RangeAggregation, SeriesListOut, VectorOut
from api.services import series as series_service
from api.services.series import Selector, TimeRange
from tuneloop.storage.timeseries.types import Matcher


def refuse_promql(request: Request) -> None:
    """These routes take a selector, not PromQL: a ``query`` parameter would otherwise be
    ignored without a word, and the answer mistaken for the expression's."""
    if "query" in request.query_params:
        problem = {
            "type": "value_error",
            "loc": ("query", "query"),
            "msg": "PromQL is answered at /api/v1/query and /api/v1/query_range; "
            "this route selects series with metric= and match=",
            "input": request.query_params["query"],
        }
        raise RequestValidationError([problem])


router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}",
    tags=["series"],
    responses={
        **AUTH_ERRORS,
        422: {"model": ErrorOut, "description": "A malformed parameter, or a query too large"},
    },
    dependencies=[Depends(refuse_promql)],
)

MAX_MATCHERS = 32

METRIC_DOC = "Metric name; any metric if left out"
MATCH_DOC = 'One PromQL label matcher per parameter: gpu="0", job=~"train.*", host!~`n[0-9]+`'
TIME_DOC = "RFC 3339 (2024-03-01T12:00:00Z) or Unix seconds"
STEP_DOC = "Seconds between points, as seconds or a duration (30s, 5m, 1h)"
WINDOW_DOC = "Lookback of rate, increase and histogram_quantile (default: one step)"


def get_matchers(
    match: Annotated[
        list[str] | None, Query(max_length=MAX_MATCHERS, description=MATCH_DOC)
    ] = None,
) -> tuple[Matcher, ...]:
    return matchers_param(match or ())


MatchersDep = Annotated[tuple[Matcher, ...], Depends(get_matchers)]


def get_selector(
    matchers: MatchersDep,
    metric: Annotated[
        str | None, Query(min_length=1, max_length=200, description=METRIC_DOC)
    ] = None,
) -> Selector:
    return Selector(metric, matchers)


SelectorDep = Annotated[Selector, Depends(get_selector)]


def get_time_range(
    start: Annotated[str, Query(description=TIME_DOC, examples=["2024-03-01T12:00:00Z"])],
    end: Annotated[str, Query(description=TIME_DOC, examples=["1709298000"])],
    step: Annotated[str, Query(description=STEP_DOC, examples=["60", "5m"])],
    window: Annotated[str | None, Query(description=WINDOW_DOC, examples=["5m"])] = None,
) -> TimeRange:
    return TimeRange(
        start=time_param(start, "start"),
        end=time_param(end, "end"),
        step_s=duration_param(step, "step"),
        window_s=None if window is None else duration_param(window, "window"),
    )


TimeRangeDep = Annotated[TimeRange, Depends(get_time_range)]


@router.get("/series", summary="Series that match a selector")
def list_series(
    runtime: RuntimeDep,
    project: ProjectDep,
    session: SessionDep,
    client: ClientWatchDep,
    selector: SelectorDep,
) -> SeriesListOut:
    with bounded_read(session, client) as connection:
        return series_service.list_series(runtime.series(connection), project.id, selector)


@router.get("/query_range", summary="Each matching series aggregated per step")
def query_range(
    runtime: RuntimeDep,
    project: ProjectDep,
    session: SessionDep,
    client: ClientWatchDep,
    selector: SelectorDep,
    time_range: TimeRangeDep,
    agg: Annotated[RangeAggregation, Query(description="Aggregation per step")] = "avg",
    q: Annotated[float | None, Query(description="Quantile in [0, 1], for agg=quantile")] = None,
) -> MatrixOut:
    """Points sit at epoch multiples of ``step``, each labelled with the start of its step.
    ``rate`` (per second) and ``increase`` handle counter resets and pair each window's
    first sample with the one before it, so consecutive increases add up to the whole."""
    with bounded_read(session, client) as connection:
        return series_service.range_query(
            runtime.series(connection), project.id, selector, time_range, agg, q
        )


@router.get("/query/latest", summary="The newest sample of each matching series")
def query_latest(
    runtime: RuntimeDep,
    project: ProjectDep,
    session: SessionDep,
    client: ClientWatchDep,
    selector: SelectorDep,
    since: Annotated[str | None, Query(description="Only samples at or after; " + TIME_DOC)] = None,
) -> VectorOut:
    after = None if since is None else time_param(since, "since")
    with bounded_read(session, client) as connection:
        return series_service.latest(runtime.series(connection), project.id, selector, after)


@router.get("/histogram_quantile", summary="Quantiles of a classic histogram per step")
def histogram_quantile(
    runtime: RuntimeDep,
    project: ProjectDep,
    session: SessionDep,
    client: ClientWatchDep,
    metric: Annotated[str, Query(min_length=1, max_length=193, description="Base name")],
    q: Annotated[float, Query(description="Quantile; < 0 gives -Inf, > 1 gives +Inf")],
    time_range: TimeRangeDep,
    matchers: MatchersDep,
) -> MatrixOut:
    """As PromQL's ``histogram_quantile(q, increase(<metric>_bucket[window]))`` per step,
    grouped by the labels other than ``le``; ``match`` selects among the bucket series."""
    with bounded_read(session, client) as connection:
        return series_service.histogram_quantile(
            runtime.series(connection), project.id, q, Selector(metric, matchers), time_range
        )
