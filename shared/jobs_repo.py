"""Every read and write of jobs and their rows, each in its own short transaction.

Functions are keyword-only and small; routes and workers never commit themselves. Writes that
the same job can repeat after a crash (metrics, checkpoints) are idempotent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    String,
    Text,
    cast,
    delete,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shared.db import read, write
from shared.errors import Conflict, NotFound, StaleClaim
from shared.models import (
    ACTIVE_STATUSES,
    Checkpoint,
    ErrorCode,
    IdempotencyKey,
    Job,
    JobEvent,
    JobMetric,
    JobStatus,
    Json,
    Sweep,
    Worker,
    WorkerState,
    utcnow,
)
from shared.resilience import retry_delay_s
from shared.tasks import EVAL_MISMATCHED_SPLIT, EVAL_SPLIT, greater_is_better

STATE = "state"
LOG = "log"
CHECKPOINT = "checkpoint"
# How long POST /v1/jobs remembers an Idempotency-Key (at least the 24 hours the API promises).
IDEMPOTENCY_KEY_TTL_S = 48 * 3600.0
# What an idempotency conflict names as its field: the HTTP header that carried the key.
IDEMPOTENCY_HEADER = "Idempotency-Key"
# A worker that has not heartbeated for this long is gone from GET /v1/workers (and its row deleted).
WORKER_RETENTION_S = 24 * 3600.0


@dataclass(frozen=True)
class Claim:
    """Who runs an attempt of a job: its worker and the attempt's number. A job's process carries
    its claim, and its writes are accepted only while that claim is the job's current one, so an
    attempt that outlived its lease (its worker died, the database was away) can neither add rows
    beside the next attempt's nor declare or delete its checkpoints."""

    job_id: int
    worker_id: str
    attempt: int

    def holds(self, job: Job, statuses: Collection[JobStatus] = ACTIVE_STATUSES) -> bool:
        """Whether this is `job`'s current claim (and the job is in one of `statuses`)."""
        return (
            job.id == self.job_id
            and job.worker_id == self.worker_id
            and job.attempts == self.attempt
            and job.status in statuses
        )


def _fence(session: Session, claim: Claim, *, job_id: int | None = None) -> Job:
    """The job, locked, when `claim` is its current one (inside the caller's write transaction);
    else StaleClaim. The row lock orders the check before any claim that would change it.
    `job_id`: the job the caller means to write to, which must be the claim's."""
    if job_id is not None and job_id != claim.job_id:
        raise ValueError(f"a claim on job {claim.job_id} used to write to job {job_id}")
    job = _locked(session, claim.job_id)
    if job is None:
        raise NotFound(f"job {claim.job_id} not found")
    if not claim.holds(job):
        raise StaleClaim(
            f"job {claim.job_id}: attempt {claim.attempt} of worker {claim.worker_id} is no longer "
            f"current (the job is {job.status}, attempt {job.attempts}, worker {job.worker_id}); "
            "its write was refused"
        )
    return job


def _current(
    session: Session, claim: Claim, *, statuses: Collection[JobStatus] = ACTIVE_STATUSES
) -> Job | None:
    """The job, locked, when `claim` is its current one and it is in one of `statuses`; else None
    (the worker has lost it: its lease expired and lease recovery or another worker moved on)."""
    job = _locked(session, claim.job_id)
    return job if job is not None and claim.holds(job, statuses) else None


def _locked(session: Session, job_id: int) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id).with_for_update()).one_or_none()


# ------------------------------------------------------------------------------------------------
# Jobs: create, read, list, cancel
# ------------------------------------------------------------------------------------------------


def create_job(
    session: Session,
    *,
    spec: dict[str, Any],
    priority: int = 0,
    metadata: dict[str, Any] | None = None,
    max_attempts: int = 3,
    owner: str | None = None,
    rerun_of: int | None = None,
) -> Job:
    with write(session):
        job = _add_job(
            session,
            spec=spec,
            priority=priority,
            metadata=metadata or {},
            max_attempts=max_attempts,
            owner=owner,
            rerun_of=rerun_of,
        )
    return job


def _add_job(
    session: Session,
    *,
    spec: dict[str, Any],
    priority: int,
    metadata: dict[str, Any],
    max_attempts: int,
    owner: str | None,
    sweep_id: int | None = None,
    rerun_of: int | None = None,
) -> Job:
    """A queued job and its first event, inside the caller's write transaction."""
    job = Job(
        spec=spec,
        priority=priority,
        metadata_=metadata,
        max_attempts=max_attempts,
        owner=owner,
        status=JobStatus.queued,
        num_processes=int(spec.get("num_processes") or 1),
        latest_metrics={},
        sweep_id=sweep_id,
        rerun_of=rerun_of,
    )
    session.add(job)
    session.flush()
    message = "job queued" if rerun_of is None else f"job queued (a rerun of job {rerun_of})"
    _state_event(session, job, message)
    return job


def create_job_once(
    session: Session,
    *,
    key: str,
    request_hash: str,
    spec: dict[str, Any],
    priority: int = 0,
    metadata: dict[str, Any] | None = None,
    max_attempts: int = 3,
    owner: str | None = None,
) -> tuple[Job, bool]:
    """create_job under an Idempotency-Key: (the job, True) the first time; (the same job, False)
    when the owner repeats the key with the same request. Conflict when the key came with another
    request.

    Race-safe: two requests with one key both try to insert it; the unique (owner, key) constraint
    lets one commit, and the other's transaction (its job included) rolls back and reads the winner.
    """
    owner_key = owner or ""  # NULL would not take part in the unique key
    for _ in range(3):
        existing = _idempotent_job(session, owner=owner_key, key=key, request_hash=request_hash)
        if existing is not None:
            return existing, False
        try:
            with write(session):
                # Expired keys go first, so that a key reused after its TTL starts afresh.
                cutoff = utcnow() - timedelta(seconds=IDEMPOTENCY_KEY_TTL_S)
                session.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < cutoff))
                job = _add_job(
                    session,
                    spec=spec,
                    priority=priority,
                    metadata=metadata or {},
                    max_attempts=max_attempts,
                    owner=owner,
                )
                session.add(
                    IdempotencyKey(
                        owner=owner_key,
                        key=key,
                        request_hash=request_hash,
                        job_id=job.id,
                        created_at=utcnow(),
                    )
                )
                session.flush()
            return job, True
        except IntegrityError:
            continue  # a concurrent request with this key committed first: read its job
    raise Conflict(
        f"the Idempotency-Key {key!r} is being used by concurrent requests; retry", field=IDEMPOTENCY_HEADER
    )


def _idempotent_job(session: Session, *, owner: str, key: str, request_hash: str) -> Job | None:
    cutoff = utcnow() - timedelta(seconds=IDEMPOTENCY_KEY_TTL_S)
    with read(session):
        row = session.scalars(
            select(IdempotencyKey).where(
                IdempotencyKey.owner == owner, IdempotencyKey.key == key, IdempotencyKey.created_at >= cutoff
            )
        ).one_or_none()
        job = session.get(Job, row.job_id) if row is not None else None
    if row is None:
        return None
    if row.request_hash != request_hash:
        raise Conflict(
            f"the Idempotency-Key {key!r} was already used with a different request (job {row.job_id}); "
            "use a new key for a new job",
            field=IDEMPOTENCY_HEADER,
        )
    if job is None:
        raise NotFound(f"job {row.job_id} of Idempotency-Key {key!r} no longer exists")
    return job


def get_job(session: Session, *, job_id: int, owner: str | None = None) -> Job:
    """The job, or NotFound. With `owner` set, another key's job is not found either."""
    with read(session):
        job = session.get(Job, job_id)
    if job is None or (owner is not None and job.owner != owner):
        raise NotFound(f"job {job_id} not found")
    return job


def list_jobs(
    session: Session,
    *,
    statuses: Sequence[JobStatus] = (),
    after: int | None = None,
    limit: int = 20,
    owner: str | None = None,
) -> tuple[list[Job], bool]:
    """Newest first; `after` is the id of the last job of the previous page."""
    query = select(Job).order_by(Job.id.desc()).limit(limit + 1)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    if after is not None:
        query = query.where(Job.id < after)
    if owner is not None:
        query = query.where(Job.owner == owner)
    with read(session):
        jobs = list(session.scalars(query))
    return jobs[:limit], len(jobs) > limit


def request_cancel(session: Session, *, job_id: int, owner: str | None = None) -> Job:
    """Queued jobs are cancelled at once; running ones become `cancelling` until their worker stops them."""
    with write(session):
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or (owner is not None and job.owner != owner):
            raise NotFound(f"job {job_id} not found")
        if job.status.is_terminal:
            raise Conflict(f"job {job_id} has already finished ({job.status})")
        _cancel(session, job, utcnow())
    return job


def _cancel(session: Session, job: Job, now: datetime) -> None:
    if job.status == JobStatus.queued:
        _transition(session, job, JobStatus.cancelled, "job cancelled before it started", now=now)
    elif job.status == JobStatus.running:
        _transition(session, job, JobStatus.cancelling, "cancellation requested", now=now)
    job.cancel_requested_at = job.cancel_requested_at or now


# ------------------------------------------------------------------------------------------------
# Sweeps: one job per combination of seeds and grid values
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepJob:
    spec: dict[str, Any]
    configuration: str  # e.g. "learning_rate=0.0001 seed=3", for the job's metadata


def create_sweep(
    session: Session,
    *,
    spec: dict[str, Any],
    seeds: list[int],
    grid: dict[str, list[Any]],
    jobs: Sequence[SweepJob],
    priority: int = 0,
    metadata: dict[str, Any] | None = None,
    max_attempts: int = 3,
    owner: str | None = None,
) -> tuple[Sweep, list[Job]]:
    """The sweep and all its jobs in one transaction: either every combination is queued or none."""
    metadata = metadata or {}
    with write(session):
        sweep = Sweep(owner=owner, spec=spec, seeds=seeds, grid=grid, metadata_=metadata, created_at=utcnow())
        session.add(sweep)
        session.flush()
        created = [
            _add_job(
                session,
                spec=job.spec,
                priority=priority,
                metadata={**metadata, "sweep_id": str(sweep.id), "sweep_configuration": job.configuration},
                max_attempts=max_attempts,
                owner=owner,
                sweep_id=sweep.id,
            )
            for job in jobs
        ]
    return sweep, created


def get_sweep(session: Session, *, sweep_id: int, owner: str | None = None) -> Sweep:
    """The sweep, or NotFound. With `owner` set, another key's sweep is not found either."""
    with read(session):
        sweep = session.get(Sweep, sweep_id)
    if sweep is None or (owner is not None and sweep.owner != owner):
        raise NotFound(f"sweep {sweep_id} not found")
    return sweep


def list_sweeps(
    session: Session, *, after: int | None = None, limit: int = 20, owner: str | None = None
) -> tuple[list[Sweep], bool]:
    """Newest first; `after` is the id of the last sweep of the previous page."""
    query = select(Sweep).order_by(Sweep.id.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(Sweep.id < after)
    if owner is not None:
        query = query.where(Sweep.owner == owner)
    with read(session):
        sweeps = list(session.scalars(query))
    return sweeps[:limit], len(sweeps) > limit


def get_sweeps(session: Session, *, sweep_ids: Sequence[int]) -> list[Sweep]:
    if not sweep_ids:
        return []
    with read(session):
        return list(session.scalars(select(Sweep).where(Sweep.id.in_(sweep_ids)).order_by(Sweep.id)))


def list_sweep_jobs(session: Session, *, sweep_ids: Sequence[int]) -> list[Job]:
    """The jobs of these sweeps, in the order they were created."""
    if not sweep_ids:
        return []
    with read(session):
        return list(session.scalars(select(Job).where(Job.sweep_id.in_(sweep_ids)).order_by(Job.id)))


def cancel_sweep(session: Session, *, sweep_id: int, owner: str | None = None) -> list[Job]:
    """Cancel the sweep's unfinished jobs as POST /v1/jobs/{id}/cancel would; its jobs afterwards.

    Conflict when every job had already finished.
    """
    now = utcnow()
    with write(session):
        sweep = session.get(Sweep, sweep_id, with_for_update=True)
        if sweep is None or (owner is not None and sweep.owner != owner):
            raise NotFound(f"sweep {sweep_id} not found")
        jobs = list(
            session.scalars(select(Job).where(Job.sweep_id == sweep_id).order_by(Job.id).with_for_update())
        )
        unfinished = [job for job in jobs if not job.status.is_terminal]
        if not unfinished:
            raise Conflict(f"sweep {sweep_id} has already finished: all its {len(jobs)} jobs have ended")
        for job in unfinished:
            _cancel(session, job, now)
        sweep.cancel_requested_at = sweep.cancel_requested_at or now
    return jobs


def list_eval_metrics(session: Session, *, job_ids: Sequence[int]) -> list[JobMetric]:
    """Every evaluation row (eval and eval_mismatched) of these jobs, by job, step and id."""
    if not job_ids:
        return []
    query = (
        select(JobMetric)
        .where(JobMetric.job_id.in_(job_ids), JobMetric.split.in_((EVAL_SPLIT, EVAL_MISMATCHED_SPLIT)))
        .order_by(JobMetric.job_id, JobMetric.step, JobMetric.id)
    )
    with read(session):
        return list(session.scalars(query))


def list_finished_jobs(
    session: Session, *, task_name: str | None = None, owner: str | None = None
) -> list[Job]:
    """Succeeded jobs on a GLUE task (one task, or all), oldest first: what the leaderboard ranks."""
    task = Job.spec["task_name"].as_string()
    query = select(Job).where(Job.status == JobStatus.succeeded, task.is_not(None)).order_by(Job.id)
    if task_name is not None:
        query = query.where(task == task_name)
    if owner is not None:
        query = query.where(Job.owner == owner)
    with read(session):
        return list(session.scalars(query))


def find_job(session: Session, *, job_id: int) -> Job | None:
    with read(session):
        return session.get(Job, job_id)


# ------------------------------------------------------------------------------------------------
# The reproducibility record
# ------------------------------------------------------------------------------------------------


def set_environment(session: Session, *, job_id: int, environment: dict[str, Any], claim: Claim) -> None:
    """What the running attempt runs with (versions, device, data and weight hashes, the spec)."""
    with write(session):
        _fence(session, claim, job_id=job_id).environment = environment


# ------------------------------------------------------------------------------------------------
# The queue: claim, heartbeat, finish, leases
# ------------------------------------------------------------------------------------------------


def queued_wider_than(session: Session, *, processes: int) -> list[int]:
    """Ids of queued jobs that need more than `processes` devices: a worker that holds fewer can
    never run them (it says so rather than leave them waiting unexplained)."""
    with read(session):
        return list(
            session.scalars(
                select(Job.id)
                .where(Job.status == JobStatus.queued, Job.num_processes > processes)
                .order_by(Job.id)
                .limit(20)
            )
        )


def claim_next(
    session: Session, *, worker_id: str, lease_s: float, max_processes: int | None = None
) -> Job | None:
    """Claim the next claimable job (priority, then age) in one atomic statement, or None.

    A job is claimable when queued and past its `not_before` (a retry's backoff). With
    max_processes (the worker's free devices or CPU slots), only a job whose num_processes fits is
    claimed; a bigger one waits for a worker with that many free.

    Idle polling is a plain SELECT first: with nothing to claim, no write transaction is opened (on
    SQLite a write transaction would serialise against the API's writes). Then Postgres picks the
    row with FOR UPDATE SKIP LOCKED, so concurrent workers each take a different job without
    waiting; SQLite runs the statement under its single write lock. Both re-check the status.
    """
    now = utcnow()
    claimable = [Job.status == JobStatus.queued, or_(Job.not_before.is_(None), Job.not_before <= now)]
    if max_processes is not None:
        claimable.append(Job.num_processes <= max_processes)
    with read(session):
        candidate = session.scalars(select(Job.id).where(*claimable).limit(1)).first()
    if candidate is None:
        return None
    next_id = (
        select(Job.id)
        .where(*claimable)
        .order_by(Job.priority.desc(), Job.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    statement = (
        update(Job)
        .where(Job.id == next_id, Job.status == JobStatus.queued)
        .values(
            status=JobStatus.running,
            worker_id=worker_id,
            attempts=Job.attempts + 1,
            started_at=func.coalesce(Job.started_at, now),
            lease_expires_at=now + timedelta(seconds=lease_s),
            updated_at=now,
            not_before=None,
        )
        .returning(Job)
        .execution_options(synchronize_session=False)
    )
    with write(session):
        job = session.scalars(statement).one_or_none()
        if job is not None:  # the statement made the transition: only its event is left to write
            _state_event(
                session,
                job,
                f"claimed by worker {worker_id} (attempt {job.attempts} of {job.max_attempts})",
                data={"worker_id": worker_id, "attempt": job.attempts},
                attempt=job.attempts,
            )
    return job


def retry_pending(session: Session, *, max_processes: int | None = None) -> bool:
    """Whether a queued job (that fits) waits for its retry backoff: a worker draining the queue
    (--exit-when-idle) waits for it rather than leave it behind."""
    query = select(Job.id).where(Job.status == JobStatus.queued, Job.not_before > utcnow())
    if max_processes is not None:
        query = query.where(Job.num_processes <= max_processes)
    with read(session):
        return session.scalars(query.limit(1)).first() is not None


def heartbeat(session: Session, *, claim: Claim, lease_s: float) -> JobStatus | None:
    """Renew the lease; the job's status, or None when this claim is no longer the job's.

    One UPDATE (no row read first): the worker beats every few seconds for each job it runs."""
    now = utcnow()
    with write(session):
        status = session.scalars(
            update(Job)
            .where(*_held_by(claim))
            .values(lease_expires_at=now + timedelta(seconds=lease_s))
            .returning(Job.status)
        ).one_or_none()
        session.execute(update(Worker).where(Worker.id == claim.worker_id).values(last_heartbeat_at=now))
    return status


def _held_by(claim: Claim) -> tuple[Any, ...]:
    """Claim.holds, as a WHERE clause."""
    return (
        Job.id == claim.job_id,
        Job.worker_id == claim.worker_id,
        Job.attempts == claim.attempt,
        Job.status.in_(ACTIVE_STATUSES),
    )


def set_output_dir(
    session: Session, *, claim: Claim, output_dir: str, devices: Sequence[str] | None = None
) -> None:
    """Where the attempt writes, and the devices it holds (CUDA indices or CPU slots)."""
    values: dict[str, Any] = {"output_dir": output_dir}
    if devices is not None:
        values["devices"] = list(devices)
    with write(session):
        session.execute(update(Job).where(*_held_by(claim)).values(**values))


def finish_job(
    session: Session,
    *,
    claim: Claim,
    status: JobStatus,
    error: str | None = None,
    result: dict[str, Any] | None = None,
    error_code: ErrorCode | None = None,
) -> bool:
    """Record a job's outcome; False when the worker had lost the job (its lease expired)."""
    with write(session):
        job = _current(session, claim)
        if job is None:
            return False
        job.lease_expires_at, job.error = None, error
        job.error_code = error_code if status == JobStatus.failed else None
        if result is not None:
            job.result = result
        code = f" [{error_code}]" if error_code and status == JobStatus.failed else ""
        _transition(
            session,
            job,
            status,
            f"job {status}{code}" + (f": {error}" if error else ""),
            level="error" if status == JobStatus.failed else "info",
            data={"error_code": code.strip(" []") or None},
        )
    return True


def fail_job(
    session: Session,
    *,
    claim: Claim,
    error_code: ErrorCode,
    error: str,
    retry_base_s: float,
    retry_cap_s: float,
) -> JobStatus | None:
    """A failed attempt: `_requeue_or_fail` decides whether it is tried again. The job keeps the
    error and its code either way. The job's status after it, or None when the claim was lost."""
    with write(session):
        job = _current(session, claim)
        if job is None:
            return None
        first_line = error.splitlines()[0] if error else ""
        _requeue_or_fail(
            session,
            job,
            error_code=error_code,
            error=error,
            cause=f"attempt {claim.attempt} failed [{error_code}]: {first_line}",
            now=utcnow(),
            retry_base_s=retry_base_s,
            retry_cap_s=retry_cap_s,
        )
        return job.status


def release_job(session: Session, *, claim: Claim, reason: str) -> bool:
    """Put a job this worker holds back in the queue without spending an attempt (worker shutdown)."""
    with write(session):
        job = _current(session, claim, statuses=(JobStatus.running,))
        if job is None:
            return False
        job.worker_id, job.lease_expires_at, job.attempts = None, None, job.attempts - 1
        _transition(session, job, JobStatus.queued, f"job requeued: {reason}")
    return True


@dataclass(frozen=True)
class ExpiredLease:
    job_id: int
    requeued: bool


def recover_expired_leases(
    session: Session, *, now: datetime | None = None, retry_base_s: float = 0.0, retry_cap_s: float = 0.0
) -> list[ExpiredLease]:
    """Jobs whose worker stopped heartbeating end their attempt as worker_lost (`_requeue_or_fail`):
    back to the queue while attempts remain, else failed; a job being cancelled is cancelled.
    With nothing expired, only a read is made (no write lock)."""
    now = now or utcnow()
    outcomes: list[ExpiredLease] = []
    expired = (Job.status.in_(ACTIVE_STATUSES), Job.lease_expires_at < now)
    with read(session):
        if session.scalars(select(Job.id).where(*expired).limit(1)).first() is None:
            return outcomes
    with write(session):
        stale = session.scalars(select(Job).where(*expired).with_for_update(skip_locked=True)).all()
        for job in stale:
            lost = f"worker {job.worker_id} stopped renewing its lease"
            _requeue_or_fail(
                session,
                job,
                error_code=ErrorCode.worker_lost,
                error=lost,
                cause=lost,
                now=now,
                retry_base_s=retry_base_s,
                retry_cap_s=retry_cap_s,
            )
            job.worker_id = None  # no worker holds it, whichever way it went
            outcomes.append(ExpiredLease(job.id, job.status == JobStatus.queued))
    return outcomes


def _requeue_or_fail(
    session: Session,
    job: Job,
    *,
    error_code: ErrorCode,
    error: str,
    cause: str,
    now: datetime,
    retry_base_s: float,
    retry_cap_s: float,
) -> None:
    """The end of an attempt that failed or was lost (inside the caller's write transaction, `job`
    locked). A cancel requested meanwhile wins: the job is cancelled. Else, when the cause lies
    outside the job (error_code.retryable) and attempts remain, it is queued again, claimable after
    an exponential backoff (`not_before`), and the next attempt resumes from the newest checkpoint.
    Else it fails for good. `cause` says in the events why the attempt ended."""
    job.error, job.error_code, job.lease_expires_at = error, error_code, None
    if job.status == JobStatus.cancelling:
        _transition(session, job, JobStatus.cancelled, f"job cancelled ({cause})", now=now)
    elif error_code.retryable and job.attempts < job.max_attempts:
        delay = retry_delay_s(job.attempts, base_s=retry_base_s, cap_s=retry_cap_s)
        job.worker_id = None
        job.not_before = now + timedelta(seconds=delay) if delay > 0 else None
        _transition(
            session,
            job,
            JobStatus.queued,
            f"{cause}; retrying in {delay:.0f}s from the newest checkpoint",
            level="warning",
            data={"error_code": error_code, "retry_in_s": delay},
        )
    else:
        if error_code.retryable:
            job.error = f"{error}, and all {job.max_attempts} attempts are spent"
        _transition(
            session,
            job,
            JobStatus.failed,
            f"job failed [{error_code}]: {job.error}",
            level="error",
            data={"error_code": error_code},
            now=now,
        )


def _transition(
    session: Session,
    job: Job,
    to: JobStatus,
    message: str,
    *,
    level: str = "info",
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    """Move `job` (locked by the caller, inside its write transaction) to status `to`, and write the
    state event that says so: every status change but the claim's single statement goes through
    here. A finished job gets its finished_at."""
    job.status = to
    if to.is_terminal:
        job.finished_at = now or utcnow()
    _state_event(session, job, message, level=level, data=data)


def _state_event(
    session: Session,
    job: Job,
    message: str,
    *,
    level: str = "info",
    data: dict[str, Any] | None = None,
    attempt: int | None = None,
) -> None:
    """The event of the status `job` now has (the live stream and the clients read the status from it)."""
    _event(
        session,
        job.id,
        STATE,
        message,
        level=level,
        data={"status": job.status, **(data or {})},
        attempt=attempt,
    )


# ------------------------------------------------------------------------------------------------
# What a running job reports: metrics, checkpoints, events, the result
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricRow:
    epoch: float
    step: int
    split: str
    name: str
    value: float


def add_metrics(
    session: Session,
    *,
    job_id: int,
    rows: Iterable[MetricRow],
    best_metric: str | None = None,
    claim: Claim,
) -> int:
    """Insert metric rows, skipping any (split, name, step) the job already has; the count inserted.

    The job's latest metrics (per split) and best evaluation are updated in the same transaction.
    The write is refused (StaleClaim) unless `claim` is the job's current claim; the rows record its
    attempt. Repeating the same call (a retry after a lost acknowledgement) adds nothing.
    """
    rows = list(rows)
    if not rows:
        return 0
    now = utcnow()
    values = [
        {
            "job_id": job_id,
            "epoch": r.epoch,
            "step": r.step,
            "split": r.split,
            "name": r.name,
            "value": r.value,
            "created_at": now,
            "attempt": claim.attempt,
        }
        for r in rows
    ]
    with write(session):
        # The job's row lock first (and the fence): the same order as every other write of the job.
        job = _fence(session, claim, job_id=job_id)
        insert = _insert_for(session)(JobMetric).values(values)
        insert = insert.on_conflict_do_nothing(index_elements=["job_id", "split", "name", "step"])
        inserted = session.execute(insert.returning(JobMetric.id)).all()
        latest = dict(job.latest_metrics or {})
        for r in rows:
            split = dict(latest.get(r.split, {}))
            if r.step >= split.get("step", -1):
                split.update({r.name: r.value, "step": r.step, "epoch": r.epoch})
            latest[r.split] = split
        job.latest_metrics = latest
        if best_metric is not None:
            _update_best(job, rows, best_metric)
    return len(inserted)


def _update_best(job: Job, rows: list[MetricRow], metric: str) -> None:
    evals = {r.name: r.value for r in rows if r.split == EVAL_SPLIT}
    if metric not in evals:
        return
    value = evals[metric]
    best = job.best_metrics
    better = greater_is_better(metric)
    if best is None or (value > best["value"] if better else value < best["value"]):
        step = next(r.step for r in rows if r.split == EVAL_SPLIT)
        epoch = next(r.epoch for r in rows if r.split == EVAL_SPLIT)
        job.best_metrics = {"metric": metric, "value": value, "step": step, "epoch": epoch, "metrics": evals}


def add_checkpoint(
    session: Session,
    *,
    job_id: int,
    step: int,
    epoch: float,
    path: str,
    metrics: dict[str, float],
    is_best: bool = False,
    claim: Claim,
    dedup_key: str | None = None,
) -> None:
    with write(session):
        _fence(session, claim, job_id=job_id)
        if is_best:
            session.execute(update(Checkpoint).where(Checkpoint.job_id == job_id).values(is_best=False))
        insert = _insert_for(session)(Checkpoint).values(
            job_id=job_id,
            step=step,
            epoch=epoch,
            path=path,
            metrics=metrics,
            is_best=is_best,
            created_at=utcnow(),
        )
        session.execute(
            insert.on_conflict_do_update(
                index_elements=["job_id", "step"],
                set_={"path": path, "metrics": metrics, "is_best": is_best, "epoch": epoch},
            )
        )
        # Also an event, so the live stream and the event cursor carry checkpoints in order.
        _event(
            session,
            job_id,
            CHECKPOINT,
            f"checkpoint at step {step}" + (" (best so far)" if is_best else ""),
            data={"step": step, "epoch": epoch, "path": path, "metrics": metrics, "is_best": is_best},
            attempt=claim.attempt,
            dedup_key=dedup_key,
        )


def delete_checkpoints(
    session: Session,
    *,
    job_id: int,
    steps: Sequence[int],
    claim: Claim,
    dedup_key: str | None = None,
) -> None:
    """Forget checkpoints whose folders were removed (save_total_limit)."""
    if not steps:
        return
    with write(session):
        _fence(session, claim, job_id=job_id)
        session.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step.in_(steps)))
        _event(
            session,
            job_id,
            CHECKPOINT,
            f"removed checkpoint(s) at step {', '.join(map(str, steps))}",
            data={"deleted_steps": list(steps)},
            attempt=claim.attempt,
            dedup_key=dedup_key,
        )


def add_event(
    session: Session,
    *,
    job_id: int,
    message: str,
    level: str = "info",
    data: dict[str, Any] | None = None,
    claim: Claim,
    dedup_key: str | None = None,
) -> None:
    """A log event. With `dedup_key`, repeating the call (a retry after a lost acknowledgement)
    adds nothing."""
    with write(session):
        _fence(session, claim, job_id=job_id)
        _event(
            session,
            job_id,
            LOG,
            message,
            level=level,
            data=data,
            attempt=claim.attempt,
            dedup_key=dedup_key,
        )


def set_result(session: Session, *, job_id: int, result: dict[str, Any], claim: Claim) -> None:
    with write(session):
        job = _fence(session, claim, job_id=job_id)
        job.result = {**(job.result or {}), **result}


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
) -> None:
    # The job's row lock first (a no-op where the caller holds it): one job's events then commit in
    # id order on Postgres too, so a cursor (`after=`, the live stream) never steps over an event
    # that commits late. SQLite's single writer gives that order anyway.
    session.execute(select(Job.id).where(Job.id == job_id).with_for_update())
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


# ------------------------------------------------------------------------------------------------
# Reading a job's rows with cursors: each page is an index range scan, whatever the job's size.
# ------------------------------------------------------------------------------------------------


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
    metrics = (
        select(
            literal("metric").label("source"),
            JobMetric.id,
            JobMetric.created_at,
            JobMetric.epoch,
            JobMetric.step,
            JobMetric.split,
            JobMetric.name,
            JobMetric.value,
            cast(null(), String).label("kind"),
            cast(null(), String).label("level"),
            cast(null(), Text).label("message"),
            cast(null(), Json).label("data"),
        )
        .where(JobMetric.job_id == job_id, JobMetric.id > after_metric)
        .order_by(JobMetric.id)
        .limit(limit)
        .subquery()
    )
    events = (
        select(
            literal("event").label("source"),
            JobEvent.id,
            JobEvent.created_at,
            cast(null(), Float).label("epoch"),
            cast(null(), Integer).label("step"),
            cast(null(), String).label("split"),
            cast(null(), String).label("name"),
            cast(null(), Float).label("value"),
            JobEvent.kind,
            JobEvent.level,
            JobEvent.message,
            JobEvent.data,
        )
        .where(JobEvent.job_id == job_id, JobEvent.id > after_event)
        .order_by(JobEvent.id)
        .limit(limit)
        .subquery()
    )
    return union_all(select(metrics), select(events))


# ------------------------------------------------------------------------------------------------
# Workers
# ------------------------------------------------------------------------------------------------


def register_worker(
    session: Session,
    *,
    worker_id: str,
    host: str,
    pid: int,
    devices: Sequence[str] = (),
    version: str | None = None,
) -> None:
    now = utcnow()
    with write(session):
        session.merge(
            Worker(
                id=worker_id,
                host=host,
                pid=pid,
                devices=list(devices),
                version=version,
                state=WorkerState.idle,
                started_at=now,
                last_heartbeat_at=now,
            )
        )


def touch_worker(session: Session, *, worker_id: str, state: WorkerState | None = None) -> None:
    """The worker is alive (and, with `state`, idle, busy or draining)."""
    values: dict[str, Any] = {"last_heartbeat_at": utcnow()}
    if state is not None:
        values["state"] = state
    with write(session):
        session.execute(update(Worker).where(Worker.id == worker_id).values(**values))


def worker_stopped(session: Session, *, worker_id: str) -> None:
    with write(session):
        session.execute(
            update(Worker).where(Worker.id == worker_id).values(stopped_at=utcnow(), state="stopped")
        )


def prune_workers(session: Session, *, now: datetime | None = None) -> int:
    """Delete workers not heard from for WORKER_RETENTION_S; how many. A read first: usually there
    are none, and then no write lock is taken."""
    cutoff = (now or utcnow()) - timedelta(seconds=WORKER_RETENTION_S)
    with read(session):
        if (
            session.scalars(select(Worker.id).where(Worker.last_heartbeat_at < cutoff).limit(1)).first()
            is None
        ):
            return 0
    with write(session):
        deleted = session.execute(
            delete(Worker).where(Worker.last_heartbeat_at < cutoff).returning(Worker.id)
        ).all()
    return len(deleted)


@dataclass(frozen=True)
class WorkerView:
    """A worker as GET /v1/workers shows it: state "gone" when it stopped heartbeating for a lease
    without saying goodbye (derived, never stored); its current jobs."""

    id: str
    host: str
    pid: int
    version: str | None
    devices: list[str]
    state: str
    started_at: datetime
    last_heartbeat_at: datetime
    stopped_at: datetime | None
    jobs: list[dict[str, Any]]


def list_workers(
    session: Session, *, lease_s: float, owner: str | None = None, now: datetime | None = None
) -> list[WorkerView]:
    """Workers heard from within WORKER_RETENTION_S, newest first, each with the jobs it holds
    (with `owner`, only that owner's jobs: the workers are shared, the jobs are not)."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=WORKER_RETENTION_S)
    with read(session):
        workers = list(
            session.scalars(
                select(Worker).where(Worker.last_heartbeat_at >= cutoff).order_by(Worker.started_at.desc())
            )
        )
        query = (
            select(Job.worker_id, Job.id, Job.attempts, Job.status, Job.devices)
            .where(Job.worker_id.in_([w.id for w in workers]), Job.status.in_(ACTIVE_STATUSES))
            .order_by(Job.id)
        )
        if owner is not None:
            query = query.where(Job.owner == owner)
        held = session.execute(query).all()
    jobs: dict[str, list[dict[str, Any]]] = {}
    for worker_id, job_id, attempt, status, devices in held:
        jobs.setdefault(worker_id or "", []).append(
            {"id": job_id, "attempt": attempt, "status": status, "devices": devices}
        )
    views = []
    for w in workers:
        state = w.state
        if state != WorkerState.stopped and w.last_heartbeat_at < now - timedelta(seconds=lease_s):
            state = "gone"
        views.append(
            WorkerView(
                id=w.id,
                host=w.host,
                pid=w.pid,
                version=w.version,
                devices=list(w.devices or []),
                state=state,
                started_at=w.started_at,
                last_heartbeat_at=w.last_heartbeat_at,
                stopped_at=w.stopped_at,
                jobs=jobs.get(w.id, []),
            )
        )
    return views
