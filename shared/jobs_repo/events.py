"""A job's events, and its status changes: each written with the event that says so."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from shared.core.lifecycle import Source, check_move
from shared.core.tables import Job, JobEvent, JobStatus, utcnow
from shared.jobs_repo.streams import notify_rows
from shared.webhooks.events import job_finished

STATE = "state"
LOG = "log"
CHECKPOINT = "checkpoint"


def transition(
    session: Session,
    job: Job,
    to: JobStatus,
    message: str,
    *,
    now: datetime | None = None,
    level: str = "info",
    data: dict[str, Any] | None = None,
    attempt: int | None = None,
    locked: bool = False,
    moved_from: Source | None = None,
) -> None:
    """Move `job` (locked by the caller, inside its write transaction) to status `to`, and write the
    state event that says so (the live stream and the clients read the status from it). Every
    status change is written here; the claim's single UPDATE statement makes its change itself and
    calls this for the event. A finished job gets its finished_at, and its webhook events are queued
    in the same transaction (shared/webhooks), so that none is lost. `locked`: the caller's own
    statement took the row lock this transaction (the claim's UPDATE, finish_job's SELECT … FOR
    UPDATE), so the event need not ask for it again (one round trip fewer per claim and per end).

    A move that the job's lifecycle (shared/core/lifecycle.py) does not have raises
    IllegalTransition, before anything is written. `moved_from`: the status the caller's own
    statement already moved the job from (the claim's UPDATE: queued; a job just created: NEW);
    by default the job's status as it is."""
    check_move(job.id, job.status if moved_from is None else moved_from, to)
    job.status = to
    if to.is_terminal:
        job.finished_at = now or utcnow()
    event = {"status": to, **(data or {})}
    _event(session, job.id, STATE, message, level=level, data=event, attempt=attempt, locked=locked)
    if to.is_terminal:
        job_finished(session, job)


def _event(
    session: Session,
    job_id: int,
    kind: str,
    message: str,
    *,
    level: str = "info",
    data: dict[str, Any] | None = None,
    attempt: int | None = None,
    dedup_key: str | None = None,
    locked: bool = False,
) -> None:
    # The job's row lock first (a no-op where the caller holds it; `locked`: it does, skip the round
    # trip): one job's events then commit in id order on Postgres too, so a cursor (`after=`, the
    # live stream) never steps over an event that commits late. SQLite's single writer gives that
    # order anyway.
    if not locked:
        session.execute(select(Job.id).where(Job.id == job_id).with_for_update())
    notify_rows(session, job_id)  # the live streams hear of it once this commits
    row = {
        "job_id": job_id,
        "kind": kind,
        "level": level,
        "message": message,
        "data": data,
        "created_at": utcnow(),
        "attempt": attempt,
        "dedup_key": dedup_key,
    }
    if dedup_key is None:
        session.add(JobEvent(**row))
        return
    insert = _insert_for(session)(JobEvent).values(row)
    session.execute(insert.on_conflict_do_nothing(index_elements=["job_id", "dedup_key"]))


def _insert_for(session: Session) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT (SQLite and Postgres spell it the same)."""
    bind = session.get_bind()
    return postgresql.insert if bind.dialect.name == "postgresql" else sqlite.insert
