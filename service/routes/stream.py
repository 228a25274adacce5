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

The job's new rows reach its streams through the process's one reader for that job
(service/background/stream_fanout.py): woken by a NOTIFY on Postgres, looking every 50 ms on SQLite, it reads
each new row once and encodes it once for all of the job's streams. A stream whose cursor is behind
what that reader holds reads its own pages first (each one statement: a UNION ALL of two index range
scans, jobs_repo.read_stream_page), so a resume from long ago costs what a cursor poller costs.

A stream outlives a database outage: its reader (or its own page read) tries again from the same
cursor, backing off, with keep-alive comments meanwhile, so the stream pauses and then goes on where
it was, without losing or repeating an event.

A stream re-checks its key every KEY_RECHECK_S (through the key cache, service/accounts/auth.py, whose rows
are at most KEY_CACHE_S old): once the key is revoked, rotated or expired, the stream sends an
`error` event ({code, message}) and closes, within KEY_RECHECK_S + KEY_CACHE_S of the change.

`Last-Event-ID` is parsed as ASCII digits only: anything else (`²`, `-1`, `1.2.3`) is refused with
422 naming the header, before the stream starts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from sqlalchemy.exc import SQLAlchemyError

from service.accounts.auth import KeyRing
from service.background.stream_fanout import FeedRow, StreamFanout, in_time_order, read_page
from service.deps import JobDep, PrincipalDep, SettingsDep, get_database, get_store
from service.edge.rate_limits import REFRESH_S, StreamSlots
from service.files.downloads import folder_of
from service.files.job_folders import new_log_pieces
from service.user_views import log_for_user
from shared.core.db_retries import Backoff, is_transient
from shared.core.errors import InvalidRequest, Unauthorized

router = APIRouter(prefix="/jobs", tags=["jobs"])

POLL_INTERVAL_S = 1.0  # how often a stream with `logs=true` looks at the log file
KEEPALIVE_S = 5.0
KEY_RECHECK_S = 2.0
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
        # isascii: str.isdigit() also takes "²" and other digits int() refuses.
        if len(parts) not in (2, 4) or not all(p.isascii() and p.isdigit() and len(p) <= 18 for p in parts):
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
    """A slot among the key's open streams (service/edge/rate_limits.py), held until the response has
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
    principal: PrincipalDep,
    logs: Annotated[bool, Query(description="Also follow the job's log file (events `log`)")] = False,
) -> AsyncIterator[ServerSentEvent]:
    """The job's new rows as they are written, as Server-Sent Events:

    - `metric`: a metric row (as in /metrics); `checkpoint`: a checkpoint saved (as in /checkpoints);
    - `status`: a status change; `event`: any other job event (as in /events);
    - `log` (with `logs=true`): new lines of the job's log, `{attempt, text}` (a non-admin key: as
      GET /logs serves them, without tracebacks or the machines' places);
    - `end`: the job has ended, `{status}`; the stream closes after it.

    A comment line keeps the connection alive every few seconds. Reconnect with `Last-Event-ID`
    to resume without loss or repeats; to start after rows read from /metrics, /events and /logs, send
    `<last metric id>.<last event id>.<X-Gluejobs-Attempt>.<X-Gluejobs-Log-Offset>` (0 for none).
    """
    database = get_database(request)
    fanout: StreamFanout = request.app.state.stream_fanout
    keys: KeyRing = request.app.state.keys
    authorization = request.headers.get("authorization")
    folder = folder_of(settings, get_store(request), job.id) if logs else None
    ended_status = job.status if job.status.is_terminal else None
    last_sent = refreshed = key_checked = time.monotonic()
    logs_read = 0.0  # when the log file was last read (0: read it now)
    backoff = Backoff(base_s=POLL_INTERVAL_S / 2, cap_s=OUTAGE_POLL_CAP_S)
    yield ServerSentEvent(comment=f"job {job.id}", retry=RETRY_MS)
    async with fanout.follow(job.id) as feed:
        while True:
            now = time.monotonic()
            if now - key_checked >= KEY_RECHECK_S:
                refused = await _key_refused(keys, authorization)
                if refused is not None:
                    yield ServerSentEvent(
                        event="error", data={"code": refused.code, "message": refused.message}
                    )
                    return
                key_checked = now
            generation = feed.generation
            rows = feed.rows_after(cursor.metric, cursor.event)
            full = False
            try:
                if now - refreshed >= REFRESH_S:
                    await anyio.to_thread.run_sync(refresh_slot)
                    refreshed = time.monotonic()
                if rows is None:  # behind what the job's reader holds: its own page first
                    page = await anyio.to_thread.run_sync(
                        read_page, database, job.id, cursor.metric, cursor.event
                    )
                    rows, full = in_time_order(page.metrics, page.events), page.full
            except SQLAlchemyError as exc:
                if not is_transient(exc):
                    raise
                # The outage record (service/edge/outage.py) has logged it; this stream waits it out.
                if time.monotonic() - last_sent >= KEEPALIVE_S:
                    yield ServerSentEvent(comment="database unavailable; waiting")
                    last_sent = time.monotonic()
                await anyio.sleep(backoff.next_delay())
                continue
            backoff.reset()
            for row in rows:
                cursor, event = _event(row, cursor)
                if row.status is not None and row.status.is_terminal:
                    ended_status = row.status
                yield event
                last_sent = time.monotonic()
            if folder is not None and (
                ended_status is not None or time.monotonic() - logs_read >= POLL_INTERVAL_S
            ):
                logs_read = time.monotonic()
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
                    # A non-admin reads the log as GET /logs serves it (service/user_views.py).
                    text = piece.text if principal.is_admin else log_for_user(settings, job, piece.text)
                    yield ServerSentEvent(
                        event="log", id=str(cursor), data={"attempt": piece.attempt, "text": text}
                    )
                    last_sent = time.monotonic()
                if pieces:
                    logs_read = 0.0
                    continue  # more may be waiting
            if full:
                continue
            if ended_status is not None:
                # Everything the job wrote came before its final status change: nothing more will come.
                yield ServerSentEvent(event="end", id=str(cursor), data={"status": ended_status})
                return
            if time.monotonic() - last_sent >= KEEPALIVE_S:
                waiting = "database unavailable; waiting" if feed.unavailable else "keep-alive"
                yield ServerSentEvent(comment=waiting)
                last_sent = time.monotonic()
            now = time.monotonic()
            due = [last_sent + KEEPALIVE_S, key_checked + KEY_RECHECK_S]
            if folder is not None:
                due.append(logs_read + POLL_INTERVAL_S)
            await feed.wait(generation, max(0.0, min(due) - now))


async def _key_refused(keys: KeyRing, authorization: str | None) -> Unauthorized | None:
    """Whether the stream's key no longer opens the API (revoked, rotated, expired): the refusal.
    The key cache answers without the database while its row is fresh; a database that is away
    leaves the stream open (it is asked again at the next check)."""
    try:
        if keys.principal_without_waiting(authorization) is not None:
            return None
        await anyio.to_thread.run_sync(keys.principal, authorization)
    except Unauthorized as refused:
        return refused
    except SQLAlchemyError as exc:
        if not is_transient(exc):
            raise
    return None


def _event(row: FeedRow, cursor: Cursor) -> tuple[Cursor, ServerSentEvent]:
    """The row as its SSE event, its JSON encoded once for every stream (by the job's reader)."""
    cursor = replace(cursor, metric=row.id) if row.source == "metric" else replace(cursor, event=row.id)
    # model_construct: the event name, id and JSON are ours (single lines), nothing to validate.
    return cursor, ServerSentEvent.model_construct(event=row.event, id=str(cursor), raw_data=row.data)
