"""Reservations: a wide job that has waited long enough holds a worker until it can start there.

Without them a job needing N devices waits as long as narrower jobs keep taking the devices that free
up. A queued job needing more devices than a worker has free (but no more than it has in all), queued
longer than GLUEJOBS_RESERVATION_AFTER_S, reserves that worker (Job.reserved_by, reserved_at): the
worker then claims nothing else, and once N of its devices are free it claims the reserved job.

One reservation per worker and one worker per job, so two wide jobs never wait on each other: each
holds its own worker, which drains. A reservation is void once its job is no longer queued (claimed,
cancelled) or its worker is gone (stopped, draining, or no heartbeat for a lease); another worker may
then reserve the job. A claim clears the job's reservation, so a job requeued later starts afresh.

Gangs (a job on N machines of D devices each, shared/jobs_repo/gangs.py) follow the same rules, all
or none. Its first machine is the ordinary claim: a worker with D free devices claims it (or, with D
busy, reserves the worker as above: the job's D per machine against the worker's devices) and opens
the gang as rank 0; the other N - 1 join it. Until they have, smaller jobs must not take each device
that frees up on the workers it waits for: `gang_hold` makes N - 1 - (members so far) workers hold
for it (they claim nothing, and join as soon as D of their devices are free), the bound and the
backfill being today's: only with reservations on and once the job has queued longer than
GLUEJOBS_RESERVATION_AFTER_S; every other worker backfills as before; a gang not full within rank
0's bound is released (no attempt spent) and its holders go back to work. The holders are the live
workers with D devices in all that are not in a gang and hold no reservation, most free devices first
(the ones likeliest to free D soonest: Slurm's backfill reserves the nodes it expects to be free
first), then by id, so every worker computes the same set. Computed at each claim rather than stored:
there is nothing to void when a gang fills, is released or its rank 0 dies, and no table the claim
of an older schema would lack. Kubernetes' coscheduling (a PodGroup's minMember) and Slurm both hold
a gang's resources until it can start whole; neither lets a partial gang run, and neither does this.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, exists, func, or_, select, update
from sqlalchemy.orm import Session

from shared.core.db import write
from shared.core.tables import (
    ACTIVE_STATUSES,
    LIVE_WORKER_STATES,
    Job,
    JobGang,
    JobGangMember,
    JobStatus,
    Worker,
)
from shared.jobs_repo.events import LOG, _event
from shared.scheduling.fair_share import ClaimPolicy, first_claimable, plan_claim
from shared.scheduling.machines import has_gang_tables, seats_by_worker


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


def gang_hold(session: Session, *, worker_id: str, policy: ClaimPolicy, now: datetime) -> int | None:
    """The job of an open gang this worker holds for (it claims nothing else meanwhile, and joins the
    gang once the job's devices are free: gangs.join_gang), or None; inside the caller's read. The
    rule and why: the module's docstring. Without reservations, without the gang tables (a schema
    before 0017) or with no gang waiting past the bound, one read (or none) and None."""
    if policy.reservation_after_s is None or not has_gang_tables(session):
        return None
    members = (
        select(func.count())
        .select_from(JobGangMember)
        .where(JobGangMember.gang_id == JobGang.id)
        .scalar_subquery()
    )
    current = (Job.status.in_(ACTIVE_STATUSES), Job.attempts == JobGang.attempt)
    # The gangs still filling, oldest first (the order join_gang fills them in), under the same
    # conditions as join_gang: the attempt is still the job's and its rank 0 is alive.
    waiting = session.execute(
        select(JobGang.job_id, JobGang.size - members, Job.num_processes)
        .join(Job, Job.id == JobGang.job_id)
        .where(
            JobGang.full_at.is_(None),
            members < JobGang.size,
            Job.status == JobStatus.running,
            Job.attempts == JobGang.attempt,
            Job.created_at <= now - timedelta(seconds=policy.reservation_after_s),
            worker_alive(Job.worker_id, now=now, lease_s=policy.lease_s),
        )
        .order_by(JobGang.opened_at, JobGang.id)
    ).all()
    if not waiting:
        return None
    workers = session.execute(
        select(Worker.id, Worker.devices).where(
            Worker.state.in_(LIVE_WORKER_STATES),
            Worker.stopped_at.is_(None),
            Worker.last_heartbeat_at >= now - timedelta(seconds=policy.lease_s),
        )
    ).all()
    capacity = {str(worker): len(devices or []) for worker, devices in workers}
    busy = dict(
        session.execute(
            select(Job.worker_id, func.sum(Job.num_processes))
            .where(Job.status.in_(ACTIVE_STATUSES), Job.worker_id.in_(list(capacity)))
            .group_by(Job.worker_id)
        ).all()
    )
    seats = seats_by_worker(session, list(capacity))
    free = {w: total - int(busy.get(w) or 0) - seats.get(w, 0) for w, total in capacity.items()}
    # Not holders: members of a gang (rank 0 included) and workers holding a reservation of their own.
    taken = set(
        session.scalars(
            select(JobGangMember.worker_id)
            .join(JobGang, JobGang.id == JobGangMember.gang_id)
            .join(Job, Job.id == JobGang.job_id)
            .where(*current)
        )
    )
    taken |= set(
        session.scalars(
            select(Job.reserved_by).where(Job.status == JobStatus.queued, Job.reserved_by.is_not(None))
        )
    )
    for job_id, missing, processes in waiting:
        fit = [w for w in capacity if w not in taken and capacity[w] >= processes]
        holders = sorted(fit, key=lambda w: (-free[w], w))[: int(missing)]
        if worker_id in holders:
            return int(job_id)
        taken.update(holders)
    return None
