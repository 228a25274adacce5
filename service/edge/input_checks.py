"""One check, on every route, for values that no database stores faithfully.

JSON and URLs can carry strings and numbers that Python accepts but the databases do not: a NUL
character (Postgres text and JSONB refuse it), a lone UTF-16 surrogate such as "\\ud800" (SQLite
stores it, and every later read of it fails to encode as UTF-8), a non-finite number (JSON has no
Infinity or NaN, so SQLite stores invalid JSON and Postgres refuses it). Pydantic accepts all three
in a `str` or `float` field. Checking each model field would miss the fields added later, so this
check runs as an app-wide dependency: before any route's own validation, over its path and query
parameters and over the whole JSON body, keys included. It answers 422 naming the field.
"""

from __future__ import annotations

import math
import re
from typing import Any

from fastapi import Request

from shared.core.errors import InvalidRequest, shorten

_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")


def _string_problem(text: str) -> str | None:
    found = _UNSTORABLE_CHARS.search(text)
    if found is None:
        return None
    # json.loads joins a valid surrogate pair into one character, so any surrogate left is a lone one.
    return "contains a NUL character" if found.group() == "\x00" else "contains a lone UTF-16 surrogate"


def _name(path: list[str | int]) -> str | None:
    return ".".join(shorten(str(part)) for part in path) or None


def find_unstorable(value: Any) -> tuple[str | None, str] | None:
    """The first (field, problem) in a parsed JSON value, or None.

    Iterative, not recursive: a body nested as deep as the JSON parser allows must not overflow
    the stack here. A bad key is reported at its parent, so a field name never holds a bad string.
    """
    stack: list[tuple[list[str | int], Any]] = [([], value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            problem = _string_problem(item)
            if problem:
                return _name(path), problem
        elif isinstance(item, float) and not math.isfinite(item):
            return _name(path), "is not a finite number"
        elif isinstance(item, dict):
            for key in item:
                problem = _string_problem(key)
                if problem:
                    return _name(path), f"has a key that {problem}"
            stack.extend(([*path, key], child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend(([*path, index], child) for index, child in reversed(list(enumerate(item))))
    return None


def _takes_json_body(request: Request) -> bool:
    # Only a body that FastAPI has parsed already (the route declares one, and it came as JSON):
    # request.json() then returns that parse from Starlette's cache instead of reading anything.
    route = request.scope.get("route")
    if getattr(route, "body_field", None) is None:
        return False
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return content_type.startswith("application/") and (
        content_type.endswith("/json") or content_type.endswith("+json")
    )


async def reject_unstorable_values(request: Request) -> None:
    """Refuse NUL characters, lone surrogates and non-finite numbers anywhere in a request."""
    for name, text in [*request.path_params.items(), *request.query_params.multi_items()]:
        if _string_problem(name):
            raise InvalidRequest(f"a query parameter's name {_string_problem(name)}")
        problem = _string_problem(str(text))
        if problem:
            raise InvalidRequest(f"{_name([name])} {problem}", field=_name([name]))
    if _takes_json_body(request) and await request.body():
        found = find_unstorable(await request.json())
        if found is not None:
            field, problem = found
            raise InvalidRequest(f"{field or 'the body'} {problem}", field=field)
