"""One place that turns errors into `{"error": {"code", "message", "field"?}}` responses.

A 422 also lists every problem found, `error.errors`: `[{field, code, message}]` (DESIGN.md's
contract), the first of them also as `error.field`/`error.message`; at most MAX_PROBLEMS, with
`error.errors_omitted` counting the rest. What passed with a word of warning beside a refusal is in
`error.warnings`, in the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.edge.outage import DATABASE_UNAVAILABLE, RETRY_AFTER_S, UNAVAILABLE_MESSAGE, DatabaseOutage
from service.error_log import describe_failure
from service.schemas.jobs import JobCreate
from service.schemas.sweeps import SweepCreate
from shared.core.db_retries import is_transient
from shared.core.errors import MAX_PROBLEMS, GluejobsError, InvalidSpec, Problem, shorten
from shared.jobspec import validation_messages
from shared.jobspec.spec import spec_keys

logger = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: DATABASE_UNAVAILABLE,
}


# A safety net: messages quote values through shared.core.errors.quote, but none is ever longer than this.
MAX_MESSAGE_CHARS = 1000


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    *,
    problems: Sequence[Problem] = (),
    warnings: Sequence[Problem] = (),
    omitted: int = 0,
) -> JSONResponse:
    """`omitted`: problems found beyond `problems` and never put into words (counted in the answer)."""
    body: dict[str, Any] = {"code": code, "message": shorten(message, MAX_MESSAGE_CHARS)}
    if field is not None:
        body["field"] = field
    if status == 422 or len(problems) > 1:
        listed = list(problems) or [Problem(field or "request", code, message)]
        body["errors"] = [_public(problem) for problem in listed[:MAX_PROBLEMS]]
        if len(listed) + omitted > MAX_PROBLEMS:
            body["errors_omitted"] = len(listed) + omitted - MAX_PROBLEMS
    if warnings:
        body["warnings"] = [_public(warning) for warning in warnings[:MAX_PROBLEMS]]
    all_headers = dict(headers or {})
    if status == 401:
        all_headers.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse({"error": body}, status_code=status, headers=all_headers)


def _public(problem: Problem) -> dict[str, str]:
    return {
        "field": shorten(problem.field, MAX_MESSAGE_CHARS),
        "code": problem.code,
        "message": shorten(problem.message, MAX_MESSAGE_CHARS),
    }


def with_more(first: str, problems: Sequence[Problem], *, more_fields: Sequence[str] = ()) -> str:
    """The first problem's sentence, saying how many more there are and where (`error.errors` lists
    them): a client that shows only the message still learns that there is more to fix.
    `more_fields`: the fields of problems beyond `problems`, found but given no message."""
    if len(problems) + len(more_fields) <= 1:
        return first
    fields = list(dict.fromkeys([*(p.field for p in problems[1:]), *more_fields]))
    shown = ", ".join(fields[:10]) + (f" and {len(fields) - 10} more fields" if len(fields) > 10 else "")
    return f"{first} (and {len(problems) + len(more_fields) - 1} more: {shown})"


def _location(loc: tuple[int | str, ...]) -> str | None:
    # A part can be a key the client sent (metadata keys): a short prefix names it well enough.
    parts = [shorten(str(p)) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


async def _gluejobs_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GluejobsError)
    field = exc.field
    problems = list(exc.problems)
    if isinstance(exc, InvalidSpec):
        # InvalidSpec names JobSpec fields, which sit under "spec" in a request
        field = f"spec.{field}" if field is not None else None
        problems = [p.under("spec") if p.field else Problem("spec", p.code, p.message) for p in problems]
    else:
        problems = [p if p.field else Problem(field or "request", p.code, p.message) for p in problems]
    # TooBusy's and StoreUnavailable's answers say when to try again.
    retry_after_s = getattr(exc, "retry_after_s", None)
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return error_response(
        exc.status_code,
        exc.code,
        with_more(exc.message, problems),
        field,
        headers=headers,
        problems=problems,
        warnings=getattr(exc, "warnings", ()),
    )


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if len(errors) <= _LOOP_ERRORS:
        return _validation_answer(errors)
    # Each message may search for a near match (difflib): many of them are CPU a thread spends,
    # not the event loop that every other client's request waits on.
    return await anyio.to_thread.run_sync(_validation_answer, errors)


# A refusal of this many errors or fewer is written on the event loop (well under a millisecond).
_LOOP_ERRORS = 2


def _validation_answer(errors: Sequence[Any]) -> JSONResponse:
    if any(tuple(e.get("loc", ()))[:1] == ("body",) and isinstance(e.get("input"), bytes) for e in errors):
        # FastAPI hands a route the raw bytes (never parsed JSON) when the content type is not JSON.
        return error_response(
            415, "unsupported_media_type", "the body must be JSON, sent with Content-Type: application/json"
        )
    first: dict[str, Any] = dict(errors[0]) if errors else {"loc": (), "msg": "invalid request"}
    field = _location(tuple(first.get("loc", ())))
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "JSON decode error")
        position = tuple(first.get("loc", ()))[1:2]
        where = f" at character {position[0]}" if position else ""
        return error_response(400, "invalid_json", f"the body is not valid JSON: {reason}{where}")
    errors = errors or [first]
    # Messages only for the problems the answer lists: counted first, so that a body of thousands
    # of unknown keys costs MAX_PROBLEMS messages (and their near-match searches), not thousands.
    problems = [
        Problem(
            _location(tuple(e.get("loc", ()))) or "body",
            validation_messages.code(e),
            validation_messages.message(e, _known_fields),
        )
        for e in errors[:MAX_PROBLEMS]
    ]
    message = problems[0].line() if field else problems[0].message
    more = [_location(tuple(e.get("loc", ()))) or "body" for e in errors[MAX_PROBLEMS:]]
    return error_response(
        422,
        "invalid_request",
        with_more(message, problems, more_fields=more),
        field,
        problems=problems,
        omitted=len(more),
    )


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    """The fields of the object an unknown field was found in, for "did you mean": a job spec's, or
    a request body's (a job's or a sweep's)."""
    parts = [part for part in loc if part != "body"]
    if parts and parts[-1] == "spec":
        return list(spec_keys())
    if not parts and loc[:1] == ("body",):
        return sorted({*JobCreate.model_fields, *SweepCreate.model_fields})
    return []


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return error_response(exc.status_code, code, str(exc.detail), headers=headers)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route takes on this path, asked of the router itself (through the public
    `matches` of its routes). Starlette names only the methods of the first route whose path
    matched, and GET /v1/jobs and POST /v1/jobs are two routes."""
    # Without what routing stored in the scope for the method that was refused.
    base = {
        k: v for k, v in request.scope.items() if k not in ("fastapi", "route", "endpoint", "path_params")
    }
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(route.matches({**base, "method": method})[0] == Match.FULL for route in routes)
    ]


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """503 while the database is unreachable; any other database error is a bug (500). Either way the
    answer comes from here, not from uvicorn's last resort, so the connection stays open."""
    if is_transient(exc):
        outage: DatabaseOutage | None = getattr(request.app.state, "outage", None)
        if outage is not None:
            outage.failed(exc)  # the engine's events have seen it too: this logs nothing new
            outage.count_refusal()
        return error_response(
            503, DATABASE_UNAVAILABLE, UNAVAILABLE_MESSAGE, headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    path = shorten(request.url.path)
    logger.error("database error on %s %s: %s", request.method, path, describe_failure(exc))
    return error_response(500, "internal_error", "internal error; the server log has the details")


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    path = shorten(request.url.path)
    logger.error("unhandled error on %s %s: %s", request.method, path, describe_failure(exc))
    return error_response(500, "internal_error", "internal error; the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GluejobsError, _gluejobs_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(SQLAlchemyError, _database_error)
    app.add_exception_handler(Exception, _unexpected_error)
