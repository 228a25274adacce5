"""Webhook events, written as deliveries inside the transaction of the change that causes them: the
job's end and its deliveries commit together or not at all, so no event is lost to a crash between
the two. Each event has a key; enqueueing the same key twice for one endpoint adds nothing, so a
write that is repeated (a retry after a lost acknowledgement) never sends an event twice.

The payload follows Standard Webhooks' recommendation: `{"type", "timestamp", "data"}`.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from shared.core.tables import (
    TERMINAL_STATUSES,
    Job,
    JobStatus,
    Sweep,
    WebhookDelivery,
    WebhookEndpoint,
    utcnow,
)
from shared.research.sweep_stats import sweep_status

# The event types are the client's words too (`gluejobs webhooks add --event`): their one home is
# the wire module, with EVENT_TYPES (what an endpoint can subscribe to) and TEST_EVENT.
from shared.wire.vocabulary import (
    CHECKPOINT_DECLARED,
    JOB_CANCELLED,
    JOB_FAILED,
    JOB_SUCCEEDED,
    SEARCH_FINISHED,
    SWEEP_FINISHED,
)

_JOB_EVENTS = {
    JobStatus.succeeded: JOB_SUCCEEDED,
    JobStatus.failed: JOB_FAILED,
    JobStatus.cancelled: JOB_CANCELLED,
}


def enqueue_event(
    session: Session,
    *,
    owner: str | None,
    event_type: str,
    data: dict[str, Any],
    key: str,
    endpoint_id: int | None = None,
) -> int:
    """Queue `event_type` for every enabled endpoint of `owner` that subscribes to it (or for the
    one endpoint `endpoint_id` alone, whatever it subscribes to: a test-send), inside the caller's
    write transaction. `key` names the event (`job:7:succeeded`): the same key is delivered once per
    endpoint however often it is enqueued. The number of deliveries added."""
    query = select(WebhookEndpoint)
    if endpoint_id is not None:
        query = query.where(WebhookEndpoint.id == endpoint_id)
    else:
        query = query.where(
            WebhookEndpoint.owner.is_not_distinct_from(owner), WebhookEndpoint.disabled.is_(False)
        )
    endpoints = [
        e for e in session.scalars(query) if endpoint_id is not None or event_type in (e.event_types or [])
    ]
    if not endpoints:
        return 0
    now = utcnow()
    payload = {"type": event_type, "timestamp": now.isoformat(), "data": data}
    rows = [
        {
            "endpoint_id": endpoint.id,
            "message_id": f"msg_{uuid.uuid4().hex}",
            "event_type": event_type,
            "event_key": key,
            "payload": payload,
            "status": "pending",
            "attempts": 0,
            "attempt_log": [],
            "next_attempt_at": now,
            "created_at": now,
        }
        for endpoint in endpoints
    ]
    insert = _insert_for(session)(WebhookDelivery).values(rows)
    insert = insert.on_conflict_do_nothing(index_elements=["endpoint_id", "event_key"])
    return len(session.execute(insert.returning(WebhookDelivery.id)).all())


def job_finished(session: Session, job: Job) -> None:
    """`job` (locked, in the caller's write transaction) has just reached a final status: its event,
    and its sweep's when it was the sweep's last unfinished job."""
    event_type = _JOB_EVENTS.get(job.status)
    if event_type is None:
        return
    enqueue_event(
        session, owner=job.owner, event_type=event_type, data=job_data(job), key=f"job:{job.id}:{job.status}"
    )
    if job.sweep_id is not None:
        _sweep_finished_if_done(session, job.sweep_id)


def job_data(job: Job) -> dict[str, Any]:
    """What a job event says about the job (GET /v1/jobs/{id} has the rest)."""
    spec = job.spec or {}
    return {
        "job_id": job.id,
        "status": str(job.status),
        "owner": job.owner,
        "task_name": spec.get("task_name"),
        "model_name_or_path": spec.get("model_name_or_path"),
        "sweep_id": job.sweep_id,
        "attempts": job.attempts,
        "error": job.error,
        "error_code": str(job.error_code) if job.error_code else None,
        "best_metrics": job.best_metrics,
        "latest_metrics": job.latest_metrics or {},
        "created_at": job.created_at.isoformat() if job.created_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }


def _sweep_finished_if_done(session: Session, sweep_id: int) -> None:
    """sweep.finished once every job of the sweep has ended. The sweep's row lock serialises the
    sweep's last jobs' ends: without it two jobs ending together on Postgres would each still see the
    other running, and neither would announce the end. (Every path takes a job's lock before its
    sweep's: cancel_sweep locks the jobs first too, so the two orders never meet.)"""
    sweep = session.scalars(select(Sweep).where(Sweep.id == sweep_id).with_for_update()).one_or_none()
    if sweep is None:
        return
    session.flush()
    unfinished = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.sweep_id == sweep_id, Job.status.not_in(list(TERMINAL_STATUSES)))
    )
    if unfinished:
        return
    statuses = list(session.scalars(select(Job.status).where(Job.sweep_id == sweep_id).order_by(Job.id)))
    job_ids = list(session.scalars(select(Job.id).where(Job.sweep_id == sweep_id).order_by(Job.id)))
    counts = {str(status): statuses.count(status) for status in JobStatus if status in statuses}
    data = {
        "sweep_id": sweep.id,
        "status": sweep_status(statuses, cancel_requested=sweep.cancel_requested_at is not None),
        "owner": sweep.owner,
        "job_ids": job_ids,
        "job_counts": counts,
    }
    enqueue_event(session, owner=sweep.owner, event_type=SWEEP_FINISHED, data=data, key=f"sweep:{sweep.id}")


def search_finished(session: Session, *, owner: str | None, search_id: int, data: dict[str, Any]) -> int:
    """A hyperparameter search has ended: the one place a search marks its end calls this inside the
    write transaction that marks it (`data`: the search's id, status, best trial …). Announced once
    per search, however often it is called."""
    payload = {"search_id": search_id, **data}
    return enqueue_event(
        session, owner=owner, event_type=SEARCH_FINISHED, data=payload, key=f"search:{search_id}"
    )


def checkpoint_declared(
    session: Session, *, job_id: int, step: int, epoch: float, metrics: dict[str, Any], is_best: bool
) -> None:
    """A job's process declared a checkpoint (in the caller's write transaction, the job locked)."""
    job = session.get(Job, job_id)
    if job is None:
        return
    data = {"job_id": job_id, "step": step, "epoch": epoch, "metrics": metrics, "is_best": is_best}
    enqueue_event(
        session,
        owner=job.owner,
        event_type=CHECKPOINT_DECLARED,
        data=data,
        key=f"checkpoint:{job_id}:{step}",
    )


def _insert_for(session: Session) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT (SQLite and Postgres spell it the same)."""
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
