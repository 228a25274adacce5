"""GET /v1/jobs/{id}/stream: a job's new rows as Server-Sent Events, until the job ends.

FastAPI's own SSE support (fastapi.sse) encodes the events; this module decides what to send.
Every event's id is a cursor, "<metric id>.<event id>.<attempt>.<byte offset>": the last metric row
and job event sent (ids grow within each table, and one job's rows commit in id order) and, with
`?logs=true`, how far into which attempt's log file. A client that reconnects with `Last-Event-ID`
gets exactly what it had not received, no more, no less. A client that read a job through the paged
endpoints first (the dashboard does: one consistent picture at once) starts the stream where those
reads ended, with the id built from them: the last metric row's id, the last event's id, and
GET /logs' X-Gluejobs-Attempt and X-Gluejobs-Log-Offset (0.0 for "no log read": every attempt's log from
its start). Checkpoints travel as job events (kind "checkpoint", written with the checkpoint row),
so they share the event cursor.

Each poll is one statement (a UNION ALL of two index range scans, jobs_repo.read_stream_page), so
an open stream costs the database what a cursor poller costs, however many rows the job has.

A stream outlives a database outage: a poll that cannot reach the database is tried again (backing
off, with keep-alive comments meanwhile) from the same cursor, so the stream pauses and then goes on
where it was, without losing or repeating an event.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from sqlalchemy.exc import SQLAlchemyError

from service.deps import JobDep, PrincipalDep, SettingsDep, get_database, get_store
from service.downloads import folder_of
from service.job_files import new_log_pieces
from service.rate_limits import REFRESH_S, StreamSlots
from service.schemas import CheckpointPublic, EventPublic, MetricPublic
from shared import jobs_repo
from shared.db import Database
from shared.errors import InvalidRequest
from shared.models import JobStatus
from shared.resilience import Backoff, is_transient

router = APIRouter(prefix="/jobs", tags=["jobs"])

POLL_INTERVAL_S = 1.0
KEEPALIVE_S = 5.0
RETRY_MS = 2000  # how long a browser's EventSource waits before it reconnects
PAGE_ROWS = 1000
OUTAGE_POLL_CAP_S = 5.0  # while the database is away, polls back off up to this
LAST_EVENT_ID = "Last-Event-ID"


@dataclass(frozen=True)
class Cursor:
    metric: int = 0
    event: int = 0
    attempt: int = 0
    offset: int = 0

    def __str__(self) -> str:
        return f"{self.metric}.{self.event}.{self.attempt}.{self.offset}"

    @classmethod
    def parse(cls, value: str | None) -> Cursor:
        if not value:
            return cls()
        parts = value.strip().split(".")
        if len(parts) not in (2, 4) or not all(p.isdigit() and len(p) <= 18 for p in parts):
            raise InvalidRequest(
                f"{LAST_EVENT_ID} {value[:80]!r} is not an id this stream sent "
                "(expected <metric id>.<event id>[.<attempt>.<offset>])",
                field=LAST_EVENT_ID,
            )
        return cls(*map(int, parts))


def _resume_from(
    last_event_id: Annotated[
        str | None,
        Header(alias=LAST_EVENT_ID, description="Resume after this event (sent by EventSource on reconnect)"),
    ] = None,
) -> Cursor:
    """A dependency, so that a bad id is refused (422) before the stream starts."""
    return Cursor.parse(last_event_id)


async def _stream_slot(
    request: Request, job: JobDep, principal: PrincipalDep, _cursor: Annotated[Cursor, Depends(_resume_from)]
) -> AsyncIterator[Callable[[], None]]:
    """A slot among the key's open streams (service/rate_limits.py), held until the response has
    ended, however it ends: 429 for a key that holds its cap. Yields what refreshes the slot. After
    the cursor's check, so that a refused id takes no slot."""
    slots: StreamSlots = request.app.state.stream_slots
    slot = await anyio.to_thread.run_sync(slots.open, principal.bucket, job.id)
    if slot is None:
        yield lambda: None
        return
    try:
        yield partial(slots.refresh, slot)
    finally:
        # Shielded: a client that went away cancels the response, and the slot must still be freed.
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(slots.close, slot)
            except SQLAlchemyError as exc:
                if not is_transient(exc):
                    raise
                # The database is away: the row stops counting once it is stale (rate_limits.STALE_S).


@router.get(
    "/{job_id}/stream",
    response_class=EventSourceResponse,
    responses={
        200: {"description": "text/event-stream of metric, checkpoint, status, event, log"},
    },
)
async def stream_job(
    job: JobDep,
    request: Request,
    settings: SettingsDep,
    cursor: Annotated[Cursor, Depends(_resume_from)],
    refresh_slot: Annotated[Callable[[], None], Depends(_stream_slot)],
    logs: Annotated[bool, Query(description="Also follow the job's log file (events `log`)")] = False,
) -> AsyncIterator[ServerSentEvent]:
    """The job's new rows as they are written, as Server-Sent Events:

    - `metric`: a metric row (as in /metrics); `checkpoint`: a checkpoint saved (as in /checkpoints);
    - `status`: a status change; `event`: any other job event (as in /events);
    - `log` (with `logs=true`): new lines of the job's log, `{attempt, text}`;
    - `end`: the job has ended, `{status}`; the stream closes after it.

    A comment line keeps the connection alive every few seconds. Reconnect with `Last-Event-ID`
    to resume without loss or repeats; to start after rows read from /metrics, /events and /logs, send
    `<last metric id>.<last event id>.<X-Gluejobs-Attempt>.<X-Gluejobs-Log-Offset>` (0 for none).
    """
    database = get_database(request)
    folder = folder_of(settings, get_store(request), job.id) if logs else None
    ended_status = job.status if job.status.is_terminal else None
    last_sent = refreshed = time.monotonic()
    backoff = Backoff(base_s=POLL_INTERVAL_S / 2, cap_s=OUTAGE_POLL_CAP_S)
    yield ServerSentEvent(comment=f"job {job.id}", retry=RETRY_MS)
    while True:
        try:
            if time.monotonic() - refreshed >= REFRESH_S:
                await anyio.to_thread.run_sync(refresh_slot)
                refreshed = time.monotonic()
            page = await anyio.to_thread.run_sync(_read_page, database, job.id, cursor)
        except SQLAlchemyError as exc:
            if not is_transient(exc):
                raise
            # The outage record (service/outage.py) has logged it; this stream waits it out.
            if time.monotonic() - last_sent >= KEEPALIVE_S:
                yield ServerSentEvent(comment="database unavailable; waiting")
                last_sent = time.monotonic()
            await anyio.sleep(backoff.next_delay())
            continue
        backoff.reset()
        for source, row in _in_time_order(page):
            cursor, event = _encode(source, row, cursor)
            if event.event == "status" and JobStatus(row["data"]["status"]).is_terminal:
                ended_status = JobStatus(row["data"]["status"])
            yield event
            last_sent = time.monotonic()
        if folder is not None:
            pieces = await anyio.to_thread.run_sync(
                partial(
                    new_log_pieces,
                    folder,
                    attempt=cursor.attempt,
                    offset=cursor.offset,
                    flush=ended_status is not None,
                )
            )
            for piece in pieces:
                cursor = replace(cursor, attempt=piece.attempt, offset=piece.offset)
                yield ServerSentEvent(
                    event="log", id=str(cursor), data={"attempt": piece.attempt, "text": piece.text}
                )
                last_sent = time.monotonic()
            if pieces:
                continue  # more may be waiting
        if page.full:
            continue
        if ended_status is not None:
            # Everything the job wrote came before its final status change: nothing more will come.
            yield ServerSentEvent(event="end", id=str(cursor), data={"status": ended_status})
            return
        if time.monotonic() - last_sent >= KEEPALIVE_S:
            yield ServerSentEvent(comment="keep-alive")
            last_sent = time.monotonic()
        await anyio.sleep(POLL_INTERVAL_S)


def _read_page(database: Database, job_id: int, cursor: Cursor) -> jobs_repo.StreamPage:
    with database.session() as session:
        return jobs_repo.read_stream_page(
            session, job_id=job_id, after_metric=cursor.metric, after_event=cursor.event, limit=PAGE_ROWS
        )


def _in_time_order(page: jobs_repo.StreamPage) -> list[tuple[str, dict[str, Any]]]:
    """Metrics and events interleaved by time; heapq.merge keeps each table's own (id) order, which
    the cursor relies on, even where clocks of different machines disagree."""
    return list(
        heapq.merge(
            (("metric", r) for r in page.metrics),
            (("event", r) for r in page.events),
            key=lambda item: item[1]["created_at"],
        )
    )


def _encode(source: str, row: dict[str, Any], cursor: Cursor) -> tuple[Cursor, ServerSentEvent]:
    if source == "metric":
        cursor = replace(cursor, metric=row["id"])
        return cursor, ServerSentEvent(event="metric", id=str(cursor), data=MetricPublic.model_validate(row))
    cursor = replace(cursor, event=row["id"])
    public = EventPublic.model_validate(row)
    if row["kind"] == jobs_repo.STATE and (row["data"] or {}).get("status"):
        return cursor, ServerSentEvent(
            event="status",
            id=str(cursor),
            data={**public.model_dump(mode="json"), "status": row["data"]["status"]},
        )
    if row["kind"] == jobs_repo.CHECKPOINT and row["data"] and "step" in row["data"]:
        checkpoint = CheckpointPublic.model_validate({**row["data"], "created_at": row["created_at"]})
        return cursor, ServerSentEvent(event="checkpoint", id=str(cursor), data=checkpoint)
    return cursor, ServerSentEvent(event="event", id=str(cursor), data=public)
