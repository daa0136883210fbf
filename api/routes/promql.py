"""The Prometheus HTTP API, so that Grafana's Prometheus data source and Prometheus tooling
can read a project's series (docs/prometheus.md, "PromQL query API")::

    curl -H "Authorization: Bearer $TOKEN" localhost:8000/api/v1/query \\
        --data-urlencode 'query=avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)'
    {"status": "success", "data": {"resultType": "vector", "result": [...]}}

The project is the token's own. Every route answers GET and POST (form-encoded, as Grafana
sends), in Prometheus' envelope; errors as Prometheus gives them: 400 ``bad_data``, 422
``execution``, 503 ``timeout``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

import tuneloop
from api.deps import API_PREFIX, AUTH_ERRORS, CurrentToken, RuntimeDep, SessionDep
from api.read_limits import READ_TIMEOUT_S, ClientWatchDep, bounded_read
from api.services import promql as service
from tuneloop.errors import InvalidInput, PermissionDenied
from tuneloop.promql import ExecutionError, PromQLError, QueryTimeout
from tuneloop.runtime import Runtime
from tuneloop.settings import get_settings
from tuneloop.storage.deadline import QueryInterrupted
from tuneloop.storage.timeseries.query import TooManySeries

router = APIRouter(prefix=API_PREFIX, tags=["prometheus"], responses={**AUTH_ERRORS})

Params = dict[str, list[str]]


async def prometheus_params(request: Request) -> Params:
    """Query string and form body together, each name with all its values (``match[]``)."""
    params: Params = {}
    pairs = list(request.query_params.multi_items())
    if request.method == "POST" and request.headers.get("content-type", "").startswith(
        "application/x-www-form-urlencoded"
    ):
        body = (await request.body()).decode("utf-8", errors="replace")
        pairs += urllib.parse.parse_qsl(body, keep_blank_values=True)
    for name, value in pairs:
        params.setdefault(name, []).append(value)
    return params


ParamsDep = Annotated[Params, Depends(prometheus_params)]


def _one(params: Params, name: str) -> str | None:
    values = params.get(name)
    return values[-1] if values else None


def _project_id(token: CurrentToken, runtime: Runtime) -> int:
    if token.project_id is None:
        raise PermissionDenied(
            "an admin token belongs to no project: query with a project's token "
            "(tuneloop token create --project NAME --role member)"
        )
    return token.project_id


def _error(status: int, error_type: str, message: str) -> JSONResponse:
    body = {"status": "error", "errorType": error_type, "error": message}
    return JSONResponse(body, status_code=status)


def _answer(compute: Callable[[], Any]) -> JSONResponse:
    """``compute()`` as ``data`` of a success, or its error as Prometheus reports it."""
    try:
        return JSONResponse({"status": "success", "data": compute()})
    except (QueryTimeout, QueryInterrupted) as exc:
        return _error(503, "timeout", str(exc))
    except (ExecutionError, TooManySeries) as exc:
        return _error(422, "execution", str(exc))
    except PermissionDenied as exc:
        return _error(403, "bad_data", str(exc))
    except (PromQLError, InvalidInput, ValueError) as exc:
        return _error(400, "bad_data", str(exc))


def _timeout_s(params: Params) -> float:
    text = _one(params, "timeout")
    if text is None:
        return READ_TIMEOUT_S
    return min(READ_TIMEOUT_S, service.duration_ms(text, "timeout") / 1000)


def _query_text(params: Params) -> str:
    text = _one(params, "query")
    if text is None:
        raise PromQLError('invalid parameter "query": missing')
    return text


@router.get("/query", summary="PromQL instant query", operation_id="prometheus_instant_query")
@router.post(
    "/query", summary="PromQL instant query (form)", operation_id="prometheus_instant_query_form"
)
def instant_query(
    token: CurrentToken,
    runtime: RuntimeDep,
    session: SessionDep,
    client: ClientWatchDep,
    params: ParamsDep,
) -> JSONResponse:
    def compute() -> Any:
        project_id = _project_id(token, runtime)
        text = _query_text(params)
        at = service.time_ms(_one(params, "time"), "time", default=datetime.now(UTC))
        timeout = _timeout_s(params)
        with bounded_read(session, client) as connection:
            return service.instant_query(
                service.source(connection, runtime.remote_series, project_id),
                text,
                at,
                max_samples=get_settings().promql_max_samples,
                timeout_s=timeout,
            )

    return _answer(compute)


@router.get("/query_range", summary="PromQL range query", operation_id="prometheus_range_query")
@router.post(
    "/query_range", summary="PromQL range query (form)", operation_id="prometheus_range_query_form"
)
def range_query(
    token: CurrentToken,
    runtime: RuntimeDep,
    session: SessionDep,
    client: ClientWatchDep,
    params: ParamsDep,
) -> JSONResponse:
    def compute() -> Any:
        project_id = _project_id(token, runtime)
        text = _query_text(params)
        start = service.time_ms(_one(params, "start"), "start")
        end = service.time_ms(_one(params, "end"), "end")
        step_text = _one(params, "step")
        if step_text is None:
            raise PromQLError('invalid parameter "step": missing')
        step = service.duration_ms(step_text, "step")
        timeout = _timeout_s(params)
        with bounded_read(session, client) as connection:
            return service.range_query(
                service.source(connection, runtime.remote_series, project_id),
                text,
                start,
                end,
                step,
                max_samples=get_settings().promql_max_samples,
                timeout_s=timeout,
            )

    return _answer(compute)


@router.get("/series", summary="Series matching selectors", operation_id="prometheus_series")
@router.post(
    "/series", summary="Series matching selectors (form)", operation_id="prometheus_series_form"
)
def series(
    token: CurrentToken,
    runtime: RuntimeDep,
    session: SessionDep,
    client: ClientWatchDep,
    params: ParamsDep,
) -> JSONResponse:
    def compute() -> Any:
        project_id = _project_id(token, runtime)
        with bounded_read(session, client) as connection:
            return service.series(
                connection,
                runtime.remote_series,
                project_id,
                params.get("match[]", []),
                _one(params, "start"),
                _one(params, "end"),
            )

    return _answer(compute)


@router.get("/labels", summary="Label names", operation_id="prometheus_labels")
@router.post("/labels", summary="Label names (form)", operation_id="prometheus_labels_form")
def labels(
    token: CurrentToken,
    runtime: RuntimeDep,
    session: SessionDep,
    client: ClientWatchDep,
    params: ParamsDep,
) -> JSONResponse:
    def compute() -> Any:
        project_id = _project_id(token, runtime)
        with bounded_read(session, client) as connection:
            return service.label_names(
                connection,
                runtime.remote_series,
                project_id,
                params.get("match[]", []),
                _one(params, "start"),
                _one(params, "end"),
            )

    return _answer(compute)


@router.get("/label/{name}/values", summary="Values of a label")
def label_values(
    name: str,
    token: CurrentToken,
    runtime: RuntimeDep,
    session: SessionDep,
    client: ClientWatchDep,
    params: ParamsDep,
) -> JSONResponse:
    def compute() -> Any:
        project_id = _project_id(token, runtime)
        with bounded_read(session, client) as connection:
            return service.label_values(
                connection,
                runtime.remote_series,
                project_id,
                name,
                params.get("match[]", []),
                _one(params, "start"),
                _one(params, "end"),
            )

    return _answer(compute)


@router.get("/metadata", summary="Metric types, for Grafana's metric browser")
def metadata(
    token: CurrentToken, runtime: RuntimeDep, session: SessionDep, client: ClientWatchDep
) -> JSONResponse:
    def compute() -> Any:
        project_id = _project_id(token, runtime)
        with bounded_read(session, client) as connection:
            return service.metadata(connection, runtime.remote_series, project_id)

    return _answer(compute)


@router.get("/status/buildinfo", summary="Version, for Grafana's data source check")
def buildinfo(token: CurrentToken) -> JSONResponse:
    # Grafana reads features off the version: the Prometheus release the engine is checked
    # against (tests/promql), with tuneloop's own in the revision.
    return JSONResponse(
        {
            "status": "success",
            "data": {
                "version": "2.42.0",
                "revision": f"tuneloop-{tuneloop.__version__}",
                "branch": "tuneloop",
                "buildUser": "tuneloop",
                "buildDate": "",
                "goVersion": "",
            },
        }
    )


@router.get("/query_exemplars", summary="Exemplars: none are stored", operation_id="exemplars")
@router.post("/query_exemplars", summary="Exemplars (form)", operation_id="exemplars_form")
def query_exemplars(token: CurrentToken) -> JSONResponse:
    # Grafana asks when a panel shows exemplars; the store keeps none.
    return JSONResponse({"status": "success", "data": []})


@router.get("/rules", summary="Recording and alerting rules: none here")
def rules(token: CurrentToken) -> JSONResponse:
    # Grafana's alerting asks a Prometheus data source for its rules; tuneloop's alert rules
    # live at /api/v1/projects/NAME/alerts/rules, in their own shape.
    return JSONResponse({"status": "success", "data": {"groups": []}})
