"""One check, on every route, for values that no database stores faithfully and for bodies whose
shape alone would cost the API more than any real request does.

JSON and URLs can carry strings and numbers that Python accepts but the databases do not: a NUL
character (Postgres text and JSONB refuse it), a lone UTF-16 surrogate such as "\\ud800" (SQLite
stores it, and every later read of it fails to encode as UTF-8), a non-finite number (JSON has no
Infinity or NaN, so SQLite stores invalid JSON and Postgres refuses it). Pydantic accepts all three
in a `str` or `float` field. Checking each model field would miss the fields added later, so this
check runs as an app-wide dependency: before any route's own validation, over its path and query
parameters and over the whole JSON body, keys included. It answers 422 naming the field.

The same walk bounds the body's shape (keys in an object, items in a list, values in all, depth):
every later step (pydantic's validation, the error handler's messages, a spec's salvage, a sweep's
checks) does work per key or item, so a 1 MiB body of 70,000 unknown keys once held the API for
minutes (issue 32). The largest real body (a search of 10 parameters of 50 choices each, a sweep of
10 grid fields of 50 values) holds under a thousand values; the limits stand well above that. The
walk itself stops at the first limit passed, and a large body is walked in a thread, off the loop.
"""

from __future__ import annotations

import math
import re
from typing import Any

import anyio
from fastapi import Request

from shared.core.errors import InvalidRequest, shorten

_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")

# The shape of a JSON body, before any model sees it (the largest real bodies are listed above).
MAX_OBJECT_KEYS = 500  # a job spec has 73 names; a grid or a space at most that many
MAX_LIST_ITEMS = 1000  # seeds (at most 100 jobs a sweep), choices and grid values (50 each)
MAX_BODY_VALUES = 5000  # every key, item and value of the body together
MAX_BODY_DEPTH = 16  # the deepest real field is body.space.<name>.choices[i], four levels
# A body up to this size is walked on the event loop (at most ~2,000 values: about a millisecond);
# a larger one in a thread, so that its walk never holds the loop.
LOOP_WALK_BYTES = 4096


class _Node:
    """Where a value sits: its parent's node and its key or index. The walk keeps these instead of a
    path per value (a copy of the path for each of 500,000 list items was seconds of CPU); the path
    is spelled out only for a value that is refused."""

    __slots__ = ("key", "parent")

    def __init__(self, parent: _Node | None, key: str | int) -> None:
        self.parent = parent
        self.key = key

    def path(self) -> list[str | int]:
        parts: list[str | int] = []
        node: _Node | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        return parts[::-1]


def _string_problem(text: str) -> str | None:
    found = _UNSTORABLE_CHARS.search(text)
    if found is None:
        return None
    # json.loads joins a valid surrogate pair into one character, so any surrogate left is a lone one.
    return "contains a NUL character" if found.group() == "\x00" else "contains a lone UTF-16 surrogate"


def _name(path: list[str | int]) -> str | None:
    return ".".join(shorten(str(part)) for part in path) or None


def _where(node: _Node | None) -> str | None:
    return _name(node.path()) if node is not None else None


def find_unstorable(value: Any, *, bounded: bool = False) -> tuple[str | None, str] | None:
    """The first (field, problem) in a parsed JSON value, or None. `bounded`: a body's shape is
    held to the limits above as well (the walk stops at the first one passed, so its cost is
    bounded by MAX_BODY_VALUES whatever the body holds).

    Iterative, not recursive: a body nested as deep as the JSON parser allows must not overflow
    the stack here. A bad key is reported at its parent, so a field name never holds a bad string.
    """
    stack: list[tuple[_Node | None, int, Any]] = [(None, 0, value)]
    values = 0
    while stack:
        node, depth, item = stack.pop()
        if isinstance(item, str):
            problem = _string_problem(item)
            if problem:
                return _where(node), problem
        elif isinstance(item, float) and not math.isfinite(item):
            return _where(node), "is not a finite number"
        elif isinstance(item, (dict, list)):
            if bounded:
                found = _shape_problem(item, depth, values)
                if found is not None:
                    return _where(node), found
                values += len(item)
            if isinstance(item, dict):
                for key in item:
                    problem = _string_problem(key)
                    if problem:
                        return _where(node), f"has a key that {problem}"
                stack.extend((_Node(node, key), depth + 1, child) for key, child in reversed(item.items()))
            else:
                stack.extend(
                    (_Node(node, index), depth + 1, item[index]) for index in range(len(item) - 1, -1, -1)
                )
    return None


def _shape_problem(item: dict[str, Any] | list[Any], depth: int, values: int) -> str | None:
    """What is too much about a container at `depth`, with `values` counted before it; None if nothing."""
    if depth >= MAX_BODY_DEPTH:
        return f"is nested too deep: a request's values may be nested at most {MAX_BODY_DEPTH} levels"
    if isinstance(item, dict) and len(item) > MAX_OBJECT_KEYS:
        return f"holds {len(item)} keys; an object in a request holds at most {MAX_OBJECT_KEYS}"
    if isinstance(item, list) and len(item) > MAX_LIST_ITEMS:
        return f"holds {len(item)} items; a list in a request holds at most {MAX_LIST_ITEMS}"
    if values + len(item) > MAX_BODY_VALUES:
        return f"takes the body past {MAX_BODY_VALUES} values, the most a request may hold"
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
    """Refuse NUL characters, lone surrogates and non-finite numbers anywhere in a request, and a
    body past the shape limits above."""
    for name, text in [*request.path_params.items(), *request.query_params.multi_items()]:
        if _string_problem(name):
            raise InvalidRequest(f"a query parameter's name {_string_problem(name)}")
        problem = _string_problem(str(text))
        if problem:
            raise InvalidRequest(f"{_name([name])} {problem}", field=_name([name]))
    if not _takes_json_body(request):
        return
    raw = await request.body()
    if not raw:
        return
    body = await request.json()
    if len(raw) <= LOOP_WALK_BYTES:
        found = find_unstorable(body, bounded=True)
    else:
        found = await anyio.to_thread.run_sync(lambda: find_unstorable(body, bounded=True))
    if found is not None:
        field, problem = found
        raise InvalidRequest(f"{field or 'the body'} {problem}", field=field)
