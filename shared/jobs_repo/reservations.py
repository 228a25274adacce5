"""Reservations: a wide job that has waited long enough holds a worker until it can start there.

Without them a job needing N devices waits as long as narrower jobs keep taking the devices that free
up. A queued job needing more devices than a worker has free (but no more than it has in all), queued
longer than GLUEJOBS_RESERVATION_AFTER_S, reserves that worker (Job.reserved_by, reserved_at): the
worker then claims nothing else, and once N of its devices are free it claims the reserved job.

One reservation per worker and one worker per job, so two wide jobs never wait on each other: each
holds its own worker, which drains. A reservation is void once its job is no longer queued (claimed,
cancelled) or its worker is gone (stopped, draining, or no heartbeat for a lease); another worker may
then reserve the job. A claim clears the job's reservation, so a job requeued later starts afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, exists, or_, select, update
from sqlalchemy.orm import Session

from shared.core.db import write
from shared.core.tables import LIVE_WORKER_STATES, Job, JobStatus, Worker
from shared.jobs_repo.events import LOG, _event
from shared.scheduling.fair_share import ClaimPolicy, first_claimable, plan_claim


def worker_alive(worker_id: Any, *, now: datetime, lease_s: float) -> ColumnElement[bool]:
    """The worker row exists, takes work, and was heard from within a lease."""
    return exists(
        select(Worker.id).where(
            Worker.id == worker_id,
            Worker.state.in_(LIVE_WORKER_STATES),
            Worker.stopped_at.is_(None),
            Worker.last_heartbeat_at >= now - timedelta(seconds=lease_s),
        )
    )


def reservation_void(*, now: datetime, lease_s: float) -> ColumnElement[bool]:
    """The job is reserved by no live worker."""
    return or_(Job.reserved_by.is_(None), ~worker_alive(Job.reserved_by, now=now, lease_s=lease_s))


def my_reservation(session: Session, *, worker_id: str) -> Job | None:
    """The queued job this worker has reserved, if any (inside the caller's read)."""
    return session.scalars(
        select(Job).where(Job.reserved_by == worker_id, Job.status == JobStatus.queued).limit(1)
    ).first()


def wide_job_conditions(
    *, free: int, capacity: int, policy: ClaimPolicy, claimable: Sequence[Any], now: datetime
) -> list[Any] | None:
    """What a job this worker may reserve matches: it needs more devices than the worker has free
    but no more than it has, has waited past the bound, and has no live reservation. None when this
    worker can reserve nothing (reservations off, or all its devices free)."""
    if policy.reservation_after_s is None or capacity <= free:
        return None
    return [
        *claimable,
        Job.num_processes > free,
        Job.num_processes <= capacity,
        Job.created_at <= now - timedelta(seconds=policy.reservation_after_s),
        reservation_void(now=now, lease_s=policy.lease_s),
    ]


def reserve_wide_job(
    session: Session, *, worker_id: str, policy: ClaimPolicy, conditions: Sequence[Any], now: datetime
) -> int | None:
    """Reserve this worker for the first job (in the claim's order) matching `conditions`
    (wide_job_conditions); its id, or None. One short write transaction; on Postgres the row is
    taken FOR UPDATE SKIP LOCKED, so two workers never reserve one job."""
    with write(session):
        job_id = first_claimable(session, plan_claim(session, policy, now=now), conditions)
        if job_id is None:
            return None
        job = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.queued)
            .values(reserved_by=worker_id, reserved_at=now)
            .returning(Job.id, Job.num_processes)
            .execution_options(synchronize_session=False)
        ).one_or_none()
        if job is None:
            return None
        _event(
            session,
            job.id,
            LOG,
            f"reserved worker {worker_id}: it takes no other job until {job.num_processes} of its "
            f"devices are free (queued longer than {policy.reservation_after_s:g}s)",
            data={"reserved_by": worker_id},
        )
    return int(job.id)


def drop_reservation(session: Session, *, job_id: int, worker_id: str) -> None:
    """The worker lets go of its reservation (its job is held back by its owner's quota)."""
    with write(session):
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.reserved_by == worker_id)
            .values(reserved_by=None, reserved_at=None)
        )
