"""The OpenAPI schema documents every error status the API answers, on every operation that can
answer it.

Those statuses come from parts that every route shares (the request guard, the input check, FastAPI's
body parsing, the key check), so they are added here, in one place, to the generated schema: a
route added later documents them without doing anything. A route documents only its own statuses
(409 for a cancel, 503 for readiness …).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from service.guard import PROTECTED_PREFIX
from service.schemas import ErrorResponse

_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

# status: (description, does this operation answer it?)
_COMMON_ERRORS: dict[int, tuple[str, Callable[[str, dict[str, Any]], bool]]] = {
    400: ("Malformed request: the body is not valid JSON, or a header is unreadable", lambda _p, _o: True),
    401: (
        "A valid `Authorization: Bearer <key>` header is required",
        lambda path, _o: path == PROTECTED_PREFIX or path.startswith(f"{PROTECTED_PREFIX}/"),
    ),
    404: (
        "Not found (also another key's objects: their existence is not revealed)",
        lambda _p, op: any(p.get("in") == "path" for p in op.get("parameters", ())),
    ),
    413: ("The request body is larger than GLUEJOBS_MAX_REQUEST_BYTES", lambda _p, _o: True),
    415: (
        "The body is not sent as JSON (Content-Type: application/json)",
        lambda _p, op: "requestBody" in op,
    ),
    # Every route: the input check refuses NUL characters and lone surrogates in any parameter.
    422: ("Invalid request: the message names the field", lambda _p, _o: True),
}


def add_error_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """Add the shared error statuses (with the error body) to each operation that can answer them."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    error_schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in error_schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components.setdefault("ErrorResponse", error_schema)
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            for status, (description, applies) in _COMMON_ERRORS.items():
                if not applies(path, operation):
                    continue
                documented = {
                    "description": description,
                    "content": {"application/json": {"schema": _ERROR_REF}},
                }
                if status == 422:
                    # FastAPI's own 422 entry describes a {"detail": [...]} body, never sent here.
                    responses["422"] = documented
                else:
                    responses.setdefault(str(status), documented)
            for status, response in responses.items():
                # Errors are JSON whatever the route's own media type (an event stream, plain text):
                # the one error handler writes them.
                if status[0] in "45" and "application/json" not in response.get("content", {}):
                    response["content"] = {"application/json": {"schema": _ERROR_REF}}
    return schema


def document_error_responses(app: FastAPI) -> None:
    """Make `app.openapi()` (and /openapi.json) include the shared error statuses."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_error_responses(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema
