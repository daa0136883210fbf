"""``GET /api/v1/projects/{project}/metrics``: the newest value of each of the project's series
(job-level: step timings, throughput, OTLP metrics; fleet-level: GPUs and hosts) in the
Prometheus text format, for an existing Prometheus to scrape::

    scrape_configs:
      - job_name: tuneloop-vision
        honor_labels: true            # keep the series' own job/instance labels
        metrics_path: /api/v1/projects/vision/metrics
        authorization: {credentials_file: /etc/prometheus/tuneloop-token}
        static_configs: [{targets: ["tuneloop:8000"]}]

Only series with a sample in the last ``max_age`` (default 5 minutes) are listed; ``metric``
and ``match`` narrow them as in the query API. ``ALERTS`` is there too, as Prometheus has it:
``ALERTS{alertname, alertstate="pending"|"firing", <labels>} 1`` per alert now pending or
firing, stamped with its last evaluation. Every role of the project may read.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query, Response

from alerts import store as alerts_store
from api.deps import API_PREFIX, AUTH_ERRORS, ProjectDep, RuntimeDep, SessionDep
from api.query_params import duration_param
from api.read_limits import ClientWatchDep, bounded_read
from api.routes.series import SelectorDep
from api.schemas.common import ErrorOut
from api.services import exposition
from api.services.series import invalid_input
from tuneloop.storage.types import utcnow

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}",
    tags=["series"],
    responses={
        **AUTH_ERRORS,
        422: {"model": ErrorOut, "description": "A malformed parameter, or too many series"},
    },
)

DEFAULT_MAX_AGE = "5m"
MAX_SERIES = 100_000
"""A fleet of 5,000 GPUs with 20 metrics each; past it, narrow with ``metric``/``match``."""
MAX_AGE_LIMIT = timedelta(days=1)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {exposition.CONTENT_TYPE: {}}, "description": "Text format"}},
    summary="The project's latest values for a Prometheus to scrape",
)
def project_metrics(
    runtime: RuntimeDep,
    project: ProjectDep,
    session: SessionDep,
    client: ClientWatchDep,
    selector: SelectorDep,
    max_age: Annotated[
        str, Query(description="Only series with a sample this recent (30s, 5m, 1h)")
    ] = DEFAULT_MAX_AGE,
) -> Response:
    age = timedelta(seconds=duration_param(max_age, "max_age"))
    if age > MAX_AGE_LIMIT:
        age = MAX_AGE_LIMIT
    since = utcnow() - age
    with bounded_read(session, client) as connection, invalid_input():
        latest = runtime.series(connection).latest(
            project.id,
            selector.metric,
            selector.matchers,
            since=since,
            max_series=MAX_SERIES,
        )
        if selector.metric in (None, exposition.ALERTS):
            alerts = alerts_store.alerts_series(session, project, selector.matchers, since=since)
            latest = [*latest, *exposition.alerts_samples(alerts)]
    return Response(exposition.render(latest), media_type=exposition.CONTENT_TYPE)
