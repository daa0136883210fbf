"""One JSON error body for every failure: ``{"detail": ..., "code": ...}``.

``detail`` is a message (a list of problems for request validation, as FastAPI reports them);
``code`` is a stable machine-readable word. tuneloop's own errors (:mod:`tuneloop.errors`,
which every component's errors subclass) reach HTTP through one handler and one table, so a
route raises them and catches none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuneloop.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PermissionDenied,
    TemporaryError,
    TuneloopError,
)

log = logging.getLogger(__name__)

_ERRORS: dict[type[TuneloopError], tuple[int, str]] = {
    NotFound: (404, "not_found"),
    Conflict: (409, "conflict"),
    PermissionDenied: (403, "forbidden"),
    InvalidInput: (422, "invalid_input"),
    TemporaryError: (503, "unavailable"),
}
"""The first of these classes an error is decides its answer; any other permanent error is a
400."""

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    422: "invalid_input",
    503: "unavailable",
}


def error_response(
    status: int, detail: object, code: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"detail": jsonable_encoder(detail), "code": code},
        status_code=status,
        headers=dict(headers) if headers else None,
    )


def code_for(status: int) -> str:
    if status in _CODES:
        return _CODES[status]
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(exc.status_code, exc.detail, code_for(exc.status_code), exc.headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # ``ctx`` can hold the raised exception object; ``msg`` already says the same in words.
    problems = [{k: v for k, v in error.items() if k != "ctx"} for error in exc.errors()]
    return error_response(422, problems, "validation_error")


async def _tuneloop_error(_request: Request, exc: Exception) -> JSONResponse:
    for kind, (status, code) in _ERRORS.items():
        if isinstance(exc, kind):
            headers = None
            if isinstance(exc, TemporaryError):
                headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
            return error_response(status, str(exc), code, headers)
    return error_response(400, str(exc), "bad_request")


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # Connection refused, server gone, lock timeouts: nothing the caller did; retry later.
    log.warning("database error on %s %s: %s", request.method, request.url.path, exc)
    return error_response(503, "database unavailable", "unavailable", {"Retry-After": "5"})


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error", "internal")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(TuneloopError, _tuneloop_error)
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(Exception, _unexpected_error)
