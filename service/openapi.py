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

from service.edge.guard import PROTECTED_PREFIX
from service.edge.origins import SAFE_METHODS
from service.schemas.common import ErrorResponse

_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_RETRY_AFTER = {"description": "Seconds to wait before trying again", "schema": {"type": "integer"}}
_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

# status: (description, does this operation (path, method, operation) answer it?)
_COMMON_ERRORS: dict[int, tuple[str, Callable[[str, str, dict[str, Any]], bool]]] = {
    400: (
        "Malformed request: the body is not valid JSON, a header is unreadable, or the Host header does not "
        "name this API",
        lambda _p, _m, _o: True,
    ),
    401: (
        "A valid `Authorization: Bearer <key>` header is required",
        lambda path, _m, _o: path == PROTECTED_PREFIX or path.startswith(f"{PROTECTED_PREFIX}/"),
    ),
    403: (
        "Sent by a web page on another origin (GLUEJOBS_ALLOWED_ORIGINS)",
        lambda _p, method, _o: method.upper() not in SAFE_METHODS,
    ),
    404: (
        "Not found (also another key's objects: their existence is not revealed)",
        lambda _p, _m, op: any(p.get("in") == "path" for p in op.get("parameters", ())),
    ),
    408: ("The body did not arrive within GLUEJOBS_BODY_TIMEOUT_S", lambda _p, _m, op: "requestBody" in op),
    413: ("The request body is larger than GLUEJOBS_MAX_REQUEST_BYTES", lambda _p, _m, _o: True),
    415: (
        "The body is not sent as JSON (Content-Type: application/json)",
        lambda _p, _m, op: "requestBody" in op,
    ),
    # Every route: the input check refuses NUL characters and lone surrogates in any parameter.
    422: ("Invalid request: the message names the field", lambda _p, _m, _o: True),
    429: (
        "Not now: this key's rate limit (`rate_limited`: GLUEJOBS_RATE_SUBMITS_PER_MINUTE, "
        "GLUEJOBS_RATE_READS_PER_MINUTE, GLUEJOBS_MAX_STREAMS_PER_KEY), its owner's quota (`over_quota`), "
        "or too many dry runs at once (GLUEJOBS_MAX_DRY_RUNS): try again after Retry-After",
        lambda path, _m, _o: path == PROTECTED_PREFIX or path.startswith(f"{PROTECTED_PREFIX}/"),
    ),
    503: (
        "The database cannot be reached (`database_unavailable`), or the API has no free connection: "
        "try again after Retry-After",
        lambda _p, _m, _o: True,
    ),
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
                if not applies(path, method, operation):
                    continue
                documented: dict[str, Any] = {
                    "description": description,
                    "content": {"application/json": {"schema": _ERROR_REF}},
                }
                if status in (429, 503):
                    documented["headers"] = {"Retry-After": _RETRY_AFTER}
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


# What service/edge/input_checks.py refuses in every string of every request, said in each string's schema:
# no NUL (an ECMA-262 escape). Lone UTF-16 surrogates are refused too, but a pattern cannot name
# them: JSON Schema validators built on Rust's regex (jsonschema-rs) refuse such a pattern whole.
STORABLE_STRING = r"^[^\u0000]*$"


def document_storable_strings(schema: dict[str, Any]) -> dict[str, Any]:
    """Give every string in the request schemas (parameters and the component schemas) the pattern
    of what the input check accepts, unless it has a pattern of its own (which is stricter)."""
    stack: list[Any] = [schema.get("components", {}).get("schemas", {})]
    for item in schema.get("paths", {}).values():
        for method, operation in item.items():
            if method in _METHODS:
                stack.extend(parameter.get("schema", {}) for parameter in operation.get("parameters", ()))
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if (
                node.get("type") == "string"
                and "pattern" not in node
                and "format" not in node
                and "enum" not in node
            ):
                node["pattern"] = STORABLE_STRING
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def document_error_responses(app: FastAPI) -> None:
    """Make `app.openapi()` (and /openapi.json) include the shared error statuses and input rules."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_storable_strings(add_error_responses(generate()))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema
