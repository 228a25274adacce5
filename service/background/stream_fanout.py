"""One reader per job per API process, fanning the job's new rows out to all of its open streams.

However many clients follow a job (GET /v1/jobs/{id}/stream), the process reads the job's new rows
once (a JobFeed's reader task), encodes each row's JSON once, and keeps the last BUFFER_ROWS rows of
each table in memory; every stream takes from that buffer what comes after its own cursor. A
stream whose cursor is behind the buffer (a resume from long ago, or one that fell behind) reads
its own pages from the database, as every stream did before, until it has caught up with the buffer.

What wakes a reader:
- Postgres: the worker's writes send `NOTIFY gluejobs_rows, '<job id>'` in the transaction that
  writes the rows (shared/jobs_repo/streams.py: notify_rows), so the notification arrives after
  the commit. One thread per API process LISTENs on its own connection (PostgresListener) and wakes
  the job's reader; it reconnects after an outage, and every reader also looks every FALLBACK_S
  whatever it heard, so a lost notification costs at most that much delay.
- SQLite has no notifications: each reader looks every TICK_S (one index range scan that finds
  nothing, for each job that has open streams, however many streams follow it).

Rows are read as the streams read them (jobs_repo.read_stream_page: one job's rows commit in id
order, so a cursor never steps over a row), and the buffer holds every row of the job with an id
between its `base` and `head` cursors, so a stream served from it neither misses nor repeats a row.
A reader that cannot reach the database tries again from the same cursor (backing off); its streams
say so in their keep-alive comments meanwhile.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from service.schemas.job_progress import CheckpointPublic, EventPublic, MetricPublic
from shared import jobs_repo
from shared.core.db import Database
from shared.core.db_retries import Backoff, is_transient
from shared.core.tables import JobEvent, JobMetric, JobStatus

logger = logging.getLogger(__name__)

TICK_S = 0.05  # SQLite: how often a job's reader looks for new rows
FALLBACK_S = 1.0  # Postgres: how often a reader looks without a notification
OUTAGE_CAP_S = 5.0  # a reader that cannot reach the database backs off up to this
BUFFER_ROWS = 2000  # per table and job: how far behind a stream may be and still share the reader
PAGE_ROWS = 1000
LISTENER_IDLE_S = 10.0  # the listener thread stops after this long without any feed
CHANNEL = jobs_repo.NOTIFY_CHANNEL


@dataclass(frozen=True)
class FeedRow:
    """One row as its stream event: which table and id (the cursor), its time (to interleave the
    tables), the SSE event name and its JSON, encoded once for every stream; `status` for a status
    change."""

    source: str  # "metric" or "event"
    id: int
    created_at: datetime
    event: str
    data: str
    status: JobStatus | None = None


def encode_row(source: str, row: dict[str, Any]) -> FeedRow:
    """A metric row or job event as the stream sends it: `metric`, `status`, `checkpoint`, `event`."""
    if source == "metric":
        data = MetricPublic.model_validate(row).model_dump_json()
        return FeedRow("metric", row["id"], row["created_at"], "metric", data)
    public = EventPublic.model_validate(row)
    payload = row["data"] or {}
    if row["kind"] == jobs_repo.STATE and payload.get("status"):
        status = JobStatus(payload["status"])
        data = json.dumps({**public.model_dump(mode="json"), "status": payload["status"]})
        return FeedRow("event", row["id"], row["created_at"], "status", data, status)
    if row["kind"] == jobs_repo.CHECKPOINT and "step" in payload:
        checkpoint = CheckpointPublic.model_validate({**payload, "created_at": row["created_at"]})
        return FeedRow("event", row["id"], row["created_at"], "checkpoint", checkpoint.model_dump_json())
    return FeedRow("event", row["id"], row["created_at"], "event", public.model_dump_json())


def in_time_order(metrics: list[FeedRow], events: list[FeedRow]) -> list[FeedRow]:
    """Metrics and events interleaved by time; heapq.merge keeps each table's own (id) order, which
    the cursor relies on, even where clocks of different machines disagree."""
    return list(heapq.merge(metrics, events, key=lambda row: row.created_at))


@dataclass(frozen=True)
class Page:
    metrics: list[FeedRow]
    events: list[FeedRow]
    full: bool


def read_page(db: Database, job_id: int, after_metric: int, after_event: int, limit: int = PAGE_ROWS) -> Page:
    """The job's rows after two cursors, encoded (in the caller's thread, not on the event loop)."""
    with db.session() as session:
        page = jobs_repo.read_stream_page(
            session, job_id=job_id, after_metric=after_metric, after_event=after_event, limit=limit
        )
    return Page(
        [encode_row("metric", r) for r in page.metrics],
        [encode_row("event", r) for r in page.events],
        page.full,
    )


def _last_ids(db: Database, job_id: int) -> tuple[int, int]:
    """The job's newest metric row and event ids (0 for none): where a new reader starts."""
    with db.engine.connect() as connection, connection.begin():
        metric = connection.scalar(select(func.max(JobMetric.id)).where(JobMetric.job_id == job_id))
        event = connection.scalar(select(func.max(JobEvent.id)).where(JobEvent.job_id == job_id))
    return int(metric or 0), int(event or 0)


class JobFeed:
    """One job's reader and its buffer of encoded rows; lives while any stream follows the job."""

    def __init__(self, fanout: StreamFanout, job_id: int) -> None:
        self.fanout = fanout
        self.job_id = job_id
        self.followers = 0
        self.unavailable = False  # the reader's last try could not reach the database
        self.generation = 0  # grows with every batch of new rows (and every change of `unavailable`)
        self._metrics: list[FeedRow] = []
        self._events: list[FeedRow] = []
        self._base: tuple[int, int] | None = None  # every row after these ids up to head is buffered
        self._head = (0, 0)
        self._changed = anyio.Event()
        self._wake = anyio.Event()
        self._task: asyncio.Task[None] | None = None

    def rows_after(self, metric: int, event: int) -> list[FeedRow] | None:
        """The buffered rows after a stream's cursor, in time order; None when the buffer does not
        reach back that far (the stream reads its own page instead)."""
        if self._base is None or metric < self._base[0] or event < self._base[1]:
            return None
        metrics = self._metrics[bisect.bisect_right(self._metrics, metric, key=lambda r: r.id) :]
        events = self._events[bisect.bisect_right(self._events, event, key=lambda r: r.id) :]
        return in_time_order(metrics, events)

    async def wait(self, generation: int, timeout_s: float) -> None:
        """Until the feed changes after `generation` (or `timeout_s` passes)."""
        if self.generation != generation:
            return
        with anyio.move_on_after(timeout_s):
            await self._changed.wait()

    def wake(self) -> None:
        self._wake.set()

    def _changed_now(self) -> None:
        self.generation += 1
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def _add(self, page: Page) -> None:
        self._metrics.extend(page.metrics)
        self._events.extend(page.events)
        base_metric, base_event = self._base or (0, 0)
        if len(self._metrics) > BUFFER_ROWS:
            drop = len(self._metrics) - BUFFER_ROWS
            base_metric = self._metrics[drop - 1].id
            del self._metrics[:drop]
        if len(self._events) > BUFFER_ROWS:
            drop = len(self._events) - BUFFER_ROWS
            base_event = self._events[drop - 1].id
            del self._events[:drop]
        self._base = (base_metric, base_event)
        self._head = (
            page.metrics[-1].id if page.metrics else self._head[0],
            page.events[-1].id if page.events else self._head[1],
        )
        self._changed_now()

    def _set_unavailable(self, unavailable: bool) -> None:
        if unavailable != self.unavailable:
            self.unavailable = unavailable
            self._changed_now()

    async def run(self) -> None:
        """The reader: new rows after `head`, whenever woken (or every tick), while followed."""
        db = self.fanout.db
        backoff = Backoff(base_s=TICK_S * 4, cap_s=OUTAGE_CAP_S)
        while self.followers:
            try:
                if self._base is None:
                    self._head = await anyio.to_thread.run_sync(_last_ids, db, self.job_id)
                    self._base = self._head
                    self._changed_now()
                self._wake = anyio.Event()  # a notification from now on wakes the next wait
                page = await anyio.to_thread.run_sync(read_page, db, self.job_id, *self._head)
            except Exception as exc:  # the reader outlives any failure: its streams depend on it
                if not (isinstance(exc, SQLAlchemyError) and is_transient(exc)):
                    logger.warning("the stream reader of job %d could not read (%r)", self.job_id, exc)
                # A transient failure is the outage record's to log (service/edge/outage.py).
                self._set_unavailable(True)
                await anyio.sleep(backoff.next_delay())
                continue
            backoff.reset()
            self._set_unavailable(False)
            if page.metrics or page.events:
                self._add(page)
            if page.full:
                continue
            await self._pause()
        self.fanout.forget(self)

    async def _pause(self) -> None:
        if not self.fanout.notified:
            await anyio.sleep(TICK_S)
            return
        with anyio.move_on_after(FALLBACK_S):
            await self._wake.wait()


class StreamFanout:
    """The API process's job feeds (app.state.stream_fanout), and on Postgres its listener."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.notified = db.dialect == "postgresql"
        self._feeds: dict[int, JobFeed] = {}
        self._listener: PostgresListener | None = None
        self._lock = threading.Lock()

    @asynccontextmanager
    async def follow(self, job_id: int) -> AsyncIterator[JobFeed]:
        """The job's feed, its reader started if this is its first follower."""
        feed = self._feeds.get(job_id)
        if feed is None:
            feed = self._feeds[job_id] = JobFeed(self, job_id)
        feed.followers += 1
        if feed._task is None:
            feed._task = asyncio.get_running_loop().create_task(feed.run())
            if self.notified:
                self._ensure_listener()
        try:
            yield feed
        finally:
            feed.followers -= 1
            feed.wake()  # a reader left without followers ends now, not after its wait

    def forget(self, feed: JobFeed) -> None:
        if self._feeds.get(feed.job_id) is feed:
            del self._feeds[feed.job_id]

    def wake(self, job_id: int | None) -> None:
        """A notification for `job_id` (None: every job, after the listener reconnected)."""
        feeds = list(self._feeds.values()) if job_id is None else [self._feeds.get(job_id)]
        for feed in feeds:
            if feed is not None:
                feed.wake()

    @property
    def following(self) -> bool:
        return bool(self._feeds)

    def _ensure_listener(self) -> None:
        with self._lock:
            if self._listener is None or not self._listener.is_alive():
                self._listener = PostgresListener(self, asyncio.get_running_loop())
                self._listener.start()


class PostgresListener(threading.Thread):
    """LISTEN gluejobs_rows on a connection of its own, waking the readers of the jobs notified.
    Survives an outage: it reconnects (backing off) and then wakes every reader, for what it may
    have missed meanwhile. Stops once no job has been followed for LISTENER_IDLE_S."""

    def __init__(self, fanout: StreamFanout, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name="gluejobs-stream-listener", daemon=True)
        self.fanout = fanout
        self.loop = loop
        url = make_url(fanout.db.url).set(drivername="postgresql")
        self.conninfo = url.render_as_string(hide_password=False)

    def run(self) -> None:
        import psycopg  # only where Postgres is used

        backoff = Backoff(base_s=0.5, cap_s=OUTAGE_CAP_S)
        idle_since = time.monotonic()
        lost = False
        while True:
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    if lost:
                        logger.info("the stream listener is connected again")
                        lost = False
                    backoff.reset()
                    self._wake(None)  # whatever was written while it was away
                    while True:
                        for notification in connection.notifies(timeout=1.0):
                            self._wake(int(notification.payload) if notification.payload.isdigit() else None)
                        if self.fanout.following:
                            idle_since = time.monotonic()
                        elif time.monotonic() - idle_since >= LISTENER_IDLE_S:
                            return
            except psycopg.Error as exc:
                if not lost:  # once per outage; the readers look every FALLBACK_S meanwhile
                    logger.warning("the stream listener lost its connection (%s)", type(exc).__name__)
                    lost = True
                if not self.fanout.following and time.monotonic() - idle_since >= LISTENER_IDLE_S:
                    return
                time.sleep(backoff.next_delay())

    def _wake(self, job_id: int | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: the API is stopping
            self.loop.call_soon_threadsafe(self.fanout.wake, job_id)
