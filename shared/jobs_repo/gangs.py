"""Gangs: one attempt of a job across several worker machines (issue 37), all or none.

The mechanism, and why. The first worker to claim such a job (the ordinary claim: fair share,
quotas, reservations, the job's lease and attempt) becomes rank 0. It reserves the rendezvous by
binding a port on its advertised address (Accelerate's static rendezvous: main_process_ip and
main_process_port, torch's c10d TCPStore hosted by rank 0's launcher) and opens the gang: a
job_gangs row naming the job, the attempt, the size and that address. Other free workers, before
their own claim, join an open gang whose job fits their free devices (a join claim) and learn their
rank and the rendezvous from it. A static rendezvous rather than an etcd or c10d elastic one: the
database already orders the claims, every member knows the whole gang before it launches, and no
further service has to run; elastic membership (torchrun's min:max nodes) is not offered.

The attempt is rank 0's claim: the job's worker_id and attempts are rank 0's, its lease is renewed
by rank 0, and its rows (metrics, checkpoints, the final model) are written by rank 0's process
alone. A member's writes would be fenced anyway; what fences a member is its seat: the gang row
exists (it is removed when the attempt ends or is released) and the job's current claim is still the
gang's. Every member heartbeats its seat; rank 0 ends the attempt when a member's heartbeat is older
than a lease, and a member stops when its seat is gone.

A gang not full within its bound is released by rank 0: the rows go, the job goes back to the queue
without spending an attempt (queue.release_job), so idle machines are not held for ever. Postgres
takes an open gang's row FOR UPDATE SKIP LOCKED, so two joiners never take one rank; on SQLite the
write lock orders them, and the (gang, rank) key refuses a second taker either way.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, select, update
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.tables import Job, JobGang, JobGangMember, JobStatus, utcnow
from shared.jobs_repo.claims import Claim, current_job
from shared.jobs_repo.events import LOG, _event
from shared.jobs_repo.queue import release_job
from shared.jobs_repo.reservations import worker_alive


@dataclass(frozen=True)
class Seat:
    """A worker's place in a gang: what it needs to launch its processes (its rank among the
    machines, how many there are, and the rendezvous) and what fences it (the gang and attempt)."""

    gang_id: int
    token: str
    job_id: int
    attempt: int
    rank: int
    size: int
    address: str
    port: int
    worker_id: str


def open_gang(session: Session, *, claim: Claim, size: int, address: str, port: int) -> Seat | None:
    """Rank 0 opens the gang of the job it claimed (`claim`), with the rendezvous it reserved; its
    seat, or None when the claim is no longer the job's (nothing is written then)."""
    if size < 2:
        raise ValueError(f"a gang has at least two members, not {size}")
    now = utcnow()
    with write(session):
        job = current_job(session, claim, statuses=(JobStatus.running,))
        if job is None:
            return None
        # A gang left by an earlier attempt (its rank 0 died before removing it) is void.
        _remove(session, job_id=claim.job_id)
        gang = JobGang(
            job_id=claim.job_id,
            attempt=claim.attempt,
            token=uuid.uuid4().hex,
            size=size,
            address=address,
            port=port,
        )
        gang.opened_at = now
        session.add(gang)
        session.flush()
        session.add(
            JobGangMember(gang_id=gang.id, rank=0, worker_id=claim.worker_id, joined_at=now, heartbeat_at=now)
        )
        _event(
            session,
            claim.job_id,
            LOG,
            f"attempt {claim.attempt}: worker {claim.worker_id} opened a gang of {size} machines",
            data={"gang": {"size": size, "rank0": claim.worker_id}},
        )
        return Seat(gang.id, gang.token, claim.job_id, claim.attempt, 0, size, address, port, claim.worker_id)


def join_gang(
    session: Session, *, worker_id: str, max_processes: int, lease_s: float, now: datetime | None = None
) -> Seat | None:
    """A free worker takes the next rank of the oldest open gang whose job fits `max_processes` of its
    free devices, whose attempt is still the job's, and whose rank 0 is alive; its seat, or None."""
    now = now or utcnow()
    members = (
        select(func.count())
        .select_from(JobGangMember)
        .where(JobGangMember.gang_id == JobGang.id)
        .scalar_subquery()
    )
    mine = select(JobGangMember.gang_id).where(JobGangMember.worker_id == worker_id)
    query = (
        select(JobGang)
        .join(Job, Job.id == JobGang.job_id)
        .where(
            JobGang.full_at.is_(None),
            members < JobGang.size,
            JobGang.id.not_in(mine),
            Job.status == JobStatus.running,
            Job.attempts == JobGang.attempt,
            Job.num_processes <= max_processes,
            worker_alive(Job.worker_id, now=now, lease_s=lease_s),
        )
        .order_by(JobGang.opened_at, JobGang.id)
        .limit(1)
    )
    with write(session):
        if session.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(of=JobGang, skip_locked=True)
        gang = session.scalars(query).first()
        if gang is None:
            return None
        rank = session.scalar(
            select(func.count()).select_from(JobGangMember).where(JobGangMember.gang_id == gang.id)
        )
        assert rank is not None
        session.add(
            JobGangMember(gang_id=gang.id, rank=rank, worker_id=worker_id, joined_at=now, heartbeat_at=now)
        )
        if rank + 1 == gang.size:
            gang.full_at = now
        _event(
            session,
            gang.job_id,
            LOG,
            f"attempt {gang.attempt}: worker {worker_id} joined the gang as machine rank {rank} of "
            f"{gang.size}",
            data={"gang": {"rank": rank, "worker_id": worker_id}},
        )
        return Seat(
            gang.id,
            gang.token,
            gang.job_id,
            gang.attempt,
            rank,
            gang.size,
            gang.address,
            gang.port,
            worker_id,
        )


def gang_full(session: Session, seat: Seat) -> bool:
    """Whether every rank of the seat's gang is taken (rank 0 waits for this before it launches)."""
    with read(session):
        return (
            session.scalar(
                select(JobGang.full_at).where(JobGang.id == seat.gang_id, JobGang.token == seat.token)
            )
            is not None
        )


def beat(session: Session, seat: Seat, *, now: datetime | None = None) -> bool:
    """The member's heartbeat; whether its seat still stands: its gang row exists and the gang's
    attempt is still the job's current one, running or being cancelled. False: stop, write nothing."""
    now = now or utcnow()
    with write(session):
        current = session.execute(
            select(JobGang.id)
            .join(Job, Job.id == JobGang.job_id)
            .where(
                JobGang.id == seat.gang_id,
                JobGang.token == seat.token,
                Job.attempts == seat.attempt,
                Job.status == JobStatus.running,
            )
        ).first()
        if current is None:
            return False
        done = session.execute(
            update(JobGangMember)
            .where(
                JobGangMember.gang_id == seat.gang_id,
                JobGangMember.rank == seat.rank,
                JobGangMember.worker_id == seat.worker_id,
            )
            .values(heartbeat_at=now)
            .execution_options(synchronize_session=False)
        )
        return bool(cast(CursorResult[Any], done).rowcount)


def stale_members(
    session: Session, seat: Seat, *, lease_s: float, now: datetime | None = None
) -> list[tuple[int, str]]:
    """The (rank, worker) of each member of the seat's gang not heard from within a lease (rank 0
    ends the attempt on any), a member that left (`leave`) among them."""
    now = now or utcnow()
    with read(session):
        rows = session.execute(
            select(JobGangMember.rank, JobGangMember.worker_id)
            .where(
                JobGangMember.gang_id == seat.gang_id,
                JobGangMember.heartbeat_at < now - timedelta(seconds=lease_s),
            )
            .order_by(JobGangMember.rank)
        )
        return [(rank, worker_id) for rank, worker_id in rows]


# A departed member's heartbeat: older than any lease, so rank 0's next look names it at once.
LEFT_AT = datetime(2000, 1, 1, tzinfo=UTC)


def leave(session: Session, seat: Seat) -> None:
    """A member that stops (its worker drained, its processes gone) says so at once rather than
    falling silent for a lease: rank 0's next look ends the attempt."""
    with write(session):
        session.execute(
            update(JobGangMember)
            .where(
                JobGangMember.gang_id == seat.gang_id,
                JobGangMember.rank == seat.rank,
                JobGangMember.worker_id == seat.worker_id,
            )
            .values(heartbeat_at=LEFT_AT)
            .execution_options(synchronize_session=False)
        )


def close_gang(session: Session, seat: Seat) -> None:
    """Rank 0 removes its gang once the attempt has ended (finished, failed, cancelled, lost): every
    other member's next heartbeat then says stop."""
    with write(session):
        gang = select(JobGang.id).where(JobGang.id == seat.gang_id, JobGang.token == seat.token)
        session.execute(delete(JobGangMember).where(JobGangMember.gang_id.in_(gang)))
        session.execute(delete(JobGang).where(JobGang.id == seat.gang_id, JobGang.token == seat.token))


def release_unfilled(session: Session, *, seat: Seat, waited_s: float) -> bool:
    """Rank 0 gives up on a gang not full within its bound: the gang goes and the job goes back to
    the queue without spending an attempt. False when the claim was already lost."""
    close_gang(session, seat)
    claim = Claim(seat.job_id, seat.worker_id, seat.attempt)
    return release_job(
        session, claim=claim, reason=f"its gang of {seat.size} machines was not full within {waited_s:g}s"
    )


def _remove(session: Session, *, job_id: int) -> None:
    gang_ids = select(JobGang.id).where(JobGang.job_id == job_id)
    session.execute(delete(JobGangMember).where(JobGangMember.gang_id.in_(gang_ids)))
    session.execute(delete(JobGang).where(JobGang.job_id == job_id))
