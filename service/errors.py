"""One place that turns errors into `{"error": {"code", "message", "field"?}}` responses."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.errors import GluejobsError, InvalidSpec

logger = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
}


def error_response(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    body: dict[str, str] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _location(loc: tuple[int | str, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


async def _gluejobs_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GluejobsError)
    field = exc.field
    if isinstance(exc, InvalidSpec) and field is not None:
        field = f"spec.{field}"  # InvalidSpec names JobSpec fields, which sit under "spec" in a request
    return error_response(exc.status_code, exc.code, exc.message, field)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    field = _location(tuple(first.get("loc", ())))
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        return error_response(400, "invalid_json", f"the body is not valid JSON: {first.get('ctx', {})}")
    if field:
        message = f"{field}: {message}"
    if len(errors) > 1:
        others = ", ".join(filter(None, (_location(tuple(e.get("loc", ()))) for e in errors[1:])))
        message += f" (and {len(errors) - 1} more: {others})"
    return error_response(422, "invalid_request", message, field)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal error; the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GluejobsError, _gluejobs_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
