"""Cursor polls (GET /v1/jobs/{id}/metrics and /events, `after=`) answered in one thread call.

A dashboard or script polls these many times a second, so each costs what the bare framework costs
(bench/api_polling.py measures the ratio): the ownership check reads two columns of the job, not
its row; the page is read as plain rows, not ORM objects; and the response is validated and
serialised once, here, into JSON bytes (the route returns them as they are; FastAPI's response
model then only documents them, instead of validating the page a second time).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from starlette.responses import Response

from service.schemas.common import Page
from service.schemas.job_progress import EventPublic, MetricPublic
from shared import jobs_repo
from shared.core.db import Database
from shared.core.errors import NotFound

_METRICS = TypeAdapter(Page[MetricPublic])
_EVENTS = TypeAdapter(Page[EventPublic])


def metrics_page(
    db: Database,
    *,
    job_id: int,
    owner: str | None,
    after: int | None,
    limit: int,
    split: str | None,
    name: str | None,
) -> Response:
    with db.engine.connect() as connection:
        page = jobs_repo.cursor_page(
            connection, "metrics", job_id=job_id, after=after, limit=limit, split=split, name=name
        )
    return _json(_METRICS, page, job_id, owner)


def events_page(db: Database, *, job_id: int, owner: str | None, after: int | None, limit: int) -> Response:
    with db.engine.connect() as connection:
        page = jobs_repo.cursor_page(connection, "events", job_id=job_id, after=after, limit=limit)
    return _json(_EVENTS, page, job_id, owner)


def _json(adapter: TypeAdapter[Any], page: jobs_repo.CursorPage, job_id: int, owner: str | None) -> Response:
    # A missing job and another key's job alike: not found (as deps.get_job).
    if not page.found or (owner is not None and page.owner != owner):
        raise NotFound(f"job {job_id} not found")
    rows = page.rows
    body = {
        "data": rows,
        "has_more": page.has_more,
        "next_cursor": str(rows[-1]["id"]) if page.has_more else None,
    }
    return Response(adapter.dump_json(adapter.validate_python(body)), media_type="application/json")
