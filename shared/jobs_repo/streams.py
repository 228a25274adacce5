"""Reading a job's rows with cursors (the API's pages and live stream): each page is an index range
scan, whatever the job's size."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, bindparam, cast, literal, null, select, text, true, union_all
from sqlalchemy.orm import Session

from shared.core.db import read
from shared.core.tables import Checkpoint, Job, JobEvent, JobMetric

# The channel on which a write of a job's rows tells the API's streams (Postgres; the payload is the
# job's id): service/background/stream_fanout.py listens.
NOTIFY_CHANNEL = "gluejobs_rows"
_NOTIFY = text(f"SELECT pg_notify('{NOTIFY_CHANNEL}', :job_id)")


def notify_rows(session: Session, job_id: int) -> None:
    """Tell the API's live streams that the job has new rows: on Postgres a NOTIFY inside the
    transaction that writes them, delivered once it commits (never before, never for a rollback;
    Postgres sends one per job however many rows the transaction writes). SQLite: nothing (the
    streams look every few tens of milliseconds)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_NOTIFY, {"job_id": str(job_id)})


def list_metrics(
    session: Session,
    *,
    job_id: int,
    after: int | None = None,
    limit: int = 1000,
    split: str | None = None,
    name: str | None = None,
) -> tuple[list[JobMetric], bool]:
    query = select(JobMetric).where(JobMetric.job_id == job_id).order_by(JobMetric.id).limit(limit + 1)
    if after is not None:
        query = query.where(JobMetric.id > after)
    if split is not None:
        query = query.where(JobMetric.split == split)
    if name is not None:
        query = query.where(JobMetric.name == name)
    with read(session):
        rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit


def list_events(
    session: Session, *, job_id: int, after: int | None = None, limit: int = 1000
) -> tuple[list[JobEvent], bool]:
    query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id).limit(limit + 1)
    if after is not None:
        query = query.where(JobEvent.id > after)
    with read(session):
        rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit


def list_checkpoints(session: Session, *, job_id: int) -> list[Checkpoint]:
    with read(session):
        return list(
            session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))
        )


@dataclass(frozen=True)
class StreamPage:
    """A job's metric rows and events after two cursors, each in id order; `full` when either side
    filled its limit (more rows are waiting)."""

    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]
    full: bool


def read_stream_page(
    session: Session, *, job_id: int, after_metric: int, after_event: int, limit: int = 1000
) -> StreamPage:
    """What the live stream sends next: ONE statement, a UNION ALL of two index range scans
    (job_metrics and job_events by (job_id, id)), so a poll costs the same however many rows the job
    has. The two sides share one column list; each fills the columns of the other with typed NULLs
    (typed, so that Postgres can unite them and the JSON column is decoded on both databases)."""
    statement = stream_statement(
        job_id=job_id, after_metric=after_metric, after_event=after_event, limit=limit
    )
    with read(session):
        rows = session.execute(statement).mappings().all()
    metric_rows = sorted(
        (
            {k: r[k] for k in ("id", "epoch", "step", "split", "name", "value", "created_at")}
            for r in rows
            if r["source"] == "metric"
        ),
        key=lambda r: r["id"],
    )
    event_rows = sorted(
        (
            {k: r[k] for k in ("id", "created_at", "kind", "level", "message", "data")}
            for r in rows
            if r["source"] == "event"
        ),
        key=lambda r: r["id"],
    )
    return StreamPage(metric_rows, event_rows, full=len(metric_rows) >= limit or len(event_rows) >= limit)


def stream_statement(*, job_id: int, after_metric: int, after_event: int, limit: int) -> Any:
    """The UNION ALL that read_stream_page runs (its own function, so a test can EXPLAIN it)."""
    metric_columns = (JobMetric.epoch, JobMetric.step, JobMetric.split, JobMetric.name, JobMetric.value)
    event_columns = (JobEvent.kind, JobEvent.level, JobEvent.message, JobEvent.data)
    metrics = select(
        literal("metric").label("source"),
        JobMetric.id,
        JobMetric.created_at,
        *metric_columns,
        *_typed_nulls(event_columns),
    )
    events = select(
        literal("event").label("source"),
        JobEvent.id,
        JobEvent.created_at,
        *_typed_nulls(metric_columns),
        *event_columns,
    )
    return union_all(
        select(_after(metrics, JobMetric, job_id=job_id, after=after_metric, limit=limit)),
        select(_after(events, JobEvent, job_id=job_id, after=after_event, limit=limit)),
    )


def _typed_nulls(columns: tuple[Any, ...]) -> list[Any]:
    """NULLs in the other side's columns, typed like them (so that Postgres can unite the two sides
    and the JSON column is decoded on both databases)."""
    return [cast(null(), column.type).label(column.key) for column in columns]


def _after(
    query: Select[Any], model: type[JobMetric] | type[JobEvent], *, job_id: int, after: int, limit: int
) -> Any:
    """`query`'s first `limit` rows of the job after the cursor `after`, in id order: an index range
    scan of (job_id, id)."""
    return query.where(model.job_id == job_id, model.id > after).order_by(model.id).limit(limit).subquery()


# The columns a page of each table carries (the API's MetricPublic and EventPublic).
_METRIC_COLUMNS = (
    JobMetric.id,
    JobMetric.epoch,
    JobMetric.step,
    JobMetric.split,
    JobMetric.name,
    JobMetric.value,
    JobMetric.created_at,
)
_EVENT_COLUMNS = (JobEvent.id, JobEvent.created_at, JobEvent.kind, JobEvent.level, JobEvent.message)
# The column that carries the job's owner beside each row of a page (no table has a column by this name).
_OWNER_LABEL = "job_owner__"


@dataclass(frozen=True)
class CursorPage:
    """A page of a job's metric rows or events after a cursor, as plain dicts; `found`: whether the
    job exists at all, `owner` its owner (the caller checks it)."""

    found: bool
    owner: str | None
    rows: list[dict[str, Any]]
    has_more: bool


@cache
def _page_statement(table: str, *, after: bool, split: bool, name: bool) -> Any:
    """The page's statement, built once per shape with bound parameters (building a SELECT costs
    more than running it on a poll's hot path)."""
    model: type[JobMetric] | type[JobEvent] = JobMetric if table == "metrics" else JobEvent
    columns = _METRIC_COLUMNS if table == "metrics" else (*_EVENT_COLUMNS, JobEvent.data)
    query = select(*columns).where(model.job_id == bindparam("job_id"))
    if after:
        query = query.where(model.id > bindparam("after"))
    if split:
        query = query.where(JobMetric.split == bindparam("split"))
    if name:
        query = query.where(JobMetric.name == bindparam("name"))
    page = query.order_by(model.id).limit(bindparam("limit")).subquery("page")
    # The job's owner and the page in one statement (one round trip on Postgres, where a poll's cost
    # was mostly its round trips): the job's row joined to its page, so no row when the job does not
    # exist, one row of NULLs when the page is empty. The page's subquery is not correlated (it takes
    # the job's id as a parameter), so the join needs no LATERAL and SQLite runs it too.
    jobs = Job.__table__
    return (
        select(jobs.c.owner.label(_OWNER_LABEL), *page.c)
        .select_from(jobs.outerjoin(page, true()))
        .where(jobs.c.id == bindparam("job_id"))
        .order_by(page.c.id)
    )


def cursor_page(
    connection: Connection,
    table: str,
    *,
    job_id: int,
    after: int | None = None,
    limit: int = 1000,
    split: str | None = None,
    name: str | None = None,
) -> CursorPage:
    """A cursor poll's read (GET /metrics or /events with `after=`): the job's owner and one page of
    `table` ("metrics" or "events") in one prepared statement, without ORM objects. The page is
    list_metrics' or list_events'. On Postgres the statement runs outside a transaction (autocommit:
    one statement sees one snapshot anyway), which saves the BEGIN and COMMIT round trips."""
    statement = _page_statement(
        table, after=after is not None, split=split is not None, name=name is not None
    )
    values = {"job_id": job_id, "after": after, "limit": limit + 1, "split": split, "name": name}
    if connection.dialect.name == "postgresql":
        connection.execution_options(isolation_level="AUTOCOMMIT")
    result = connection.execute(statement, values).mappings().all()
    if not result:
        return CursorPage(False, None, [], False)
    owner = result[0][_OWNER_LABEL]
    rows = [{k: v for k, v in r.items() if k != _OWNER_LABEL} for r in result if r["id"] is not None]
    return CursorPage(True, owner, rows[:limit], len(rows) > limit)
