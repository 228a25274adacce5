"""The queue, as workers use it: claim, heartbeat, record the outcome, recover expired leases."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.db_retries import retry_delay_s
from shared.core.lifecycle import IllegalTransition, check_move
from shared.core.tables import ACTIVE_STATUSES, ErrorCode, Job, JobEvent, JobStatus, Worker, utcnow
from shared.jobs_repo.claim_statement import STEPWISE, claim_in_one_statement, one_statement_applies
from shared.jobs_repo.claims import Claim, current_job, held_by
from shared.jobs_repo.events import STATE, transition
from shared.jobs_repo.reservations import (
    drop_reservation,
    gang_hold,
    my_reservation,
    reserve_wide_job,
    wide_job_conditions,
)
from shared.scheduling.fair_share import ClaimPolicy, first_claimable, plan_claim
from shared.scheduling.machines import has_gang_tables
from shared.scheduling.quotas import has_storage_tables, within_device_quota


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
    session: Session,
    *,
    worker_id: str,
    lease_s: float,
    max_processes: int | None = None,
    capacity: int | None = None,
    policy: ClaimPolicy | None = None,
    skip: Collection[int] = (),
) -> Job | None:
    """Claim the next claimable job in the order of `policy` (shared/scheduling/fair_share.py: fair share,
    priority, age; without a policy: priority, then age), or None.

    On Postgres the common claim is one statement (claim_statement.py: pick, claim, event and
    NOTIFY in one round trip, autocommit); where it says it cannot decide alone (the picked job's
    owner has a quota of its own, a default quota is configured, this worker holds a reservation, a
    wide job waits to reserve one, a gang fills: its holders are the stepwise claim's to find), and
    on SQLite, the claim is `_claim_stepwise`, the multi-statement claim below. Both pick the same
    job (tests/shared/test_claim_statement.py compares them over random queues, gang jobs among
    them): a new condition on what a claim may take (a new quota) goes into both, or the statement
    hands the jobs it concerns to the stepwise claim.
    """
    policy = policy or ClaimPolicy()
    # A database still at the previous schema (a fleet mid-upgrade) lacks the storage tables the
    # statement reads: the stepwise claim, which does without them, claims there until `migrate`.
    if (
        session.get_bind().dialect.name == "postgresql"
        and one_statement_applies(policy)
        and has_storage_tables(session)
    ):
        job = claim_in_one_statement(
            session,
            worker_id=worker_id,
            lease_s=lease_s,
            max_processes=max_processes,
            capacity=capacity,
            policy=policy,
            skip=skip,
            gangs=has_gang_tables(session),
        )
        if job is not STEPWISE:
            return job
    return _claim_stepwise(
        session,
        worker_id=worker_id,
        lease_s=lease_s,
        max_processes=max_processes,
        capacity=capacity,
        policy=policy,
        skip=skip,
    )


def _claim_stepwise(
    session: Session,
    *,
    worker_id: str,
    lease_s: float,
    max_processes: int | None = None,
    capacity: int | None = None,
    policy: ClaimPolicy | None = None,
    skip: Collection[int] = (),
) -> Job | None:
    """The claim in several statements: the reference the one-statement claim must agree with, and
    the path for what that statement leaves to it (and for SQLite).

    A job is claimable when queued, past its `not_before` (a retry's backoff), and within its owner's
    quotas. With max_processes (the worker's free devices or CPU slots), only a job whose
    num_processes fits is claimed. With capacity (all the worker's devices) and a policy with
    reservations, a wide job that has waited long enough reserves this worker (reservations.py):
    it then claims nothing else until that job fits; and a worker that holds for a gang still
    filling (reservations.gang_hold) claims nothing: it joins that gang once it can.

    Idle polling is a plain SELECT first: with nothing to claim, no write transaction is opened (on
    SQLite a write transaction would serialise against the API's writes). Then one short write
    transaction picks the row (on Postgres FOR UPDATE SKIP LOCKED, so concurrent workers each take a
    different job without waiting; SQLite runs it under its single write lock) and claims it with
    one UPDATE that re-checks the status.

    `skip`: jobs this worker handed back because its build cannot run them (refuse_job); it never
    takes them again, while another build may.
    """
    policy = policy or ClaimPolicy()
    now = utcnow()
    claimable = [Job.status == JobStatus.queued, or_(Job.not_before.is_(None), Job.not_before <= now)]
    if skip:
        claimable.append(Job.id.not_in(list(skip)))
    widest = capacity if capacity is not None else max_processes
    reserving = capacity is not None and max_processes is not None and policy.reservation_after_s is not None
    wide = None
    reserved = None
    with read(session):  # one read for the idle poll, whatever the policy
        fits_now = session.scalars(select(Job.id).where(*claimable, *_fit(max_processes)).limit(1)).first()
        if fits_now is None and (
            widest == max_processes
            or session.scalars(select(Job.id).where(*claimable, *_fit(widest)).limit(1)).first() is None
        ):
            return None
        if reserving and gang_hold(session, worker_id=worker_id, policy=policy, now=now) is not None:
            return None  # this worker keeps its devices for a gang's job, and joins it (gangs.join_gang)
        if reserving and capacity is not None and max_processes is not None:
            reserved = my_reservation(session, worker_id=worker_id)
            wide = wide_job_conditions(
                free=max_processes, capacity=capacity, policy=policy, claimable=claimable, now=now
            )
            if reserved is None and wide is not None:
                wide = wide if session.scalars(select(Job.id).where(*wide).limit(1)).first() else None
    if fits_now is None and reserved is None and wide is None:
        return None  # only jobs wider than the free devices, none to reserve: no write transaction
    if reserved is not None and max_processes is not None:
        if reserved.num_processes > max_processes:
            return None  # this worker keeps its devices for its reserved job
        mine = [*claimable, Job.id == reserved.id, *_fit(max_processes)]
        job = _claim_first(session, policy, mine, worker_id, lease_s, now)
        if job is not None:
            return job
        drop_reservation(session, job_id=reserved.id, worker_id=worker_id)  # held back by quota
    elif wide is not None and reserve_wide_job(
        session, worker_id=worker_id, policy=policy, conditions=wide, now=now
    ):
        return None
    return _claim_first(session, policy, [*claimable, *_fit(max_processes)], worker_id, lease_s, now)


def _fit(processes: int | None) -> list[Any]:
    return [Job.num_processes <= processes] if processes is not None else []


def _claim_first(
    session: Session,
    policy: ClaimPolicy,
    conditions: list[Any],
    worker_id: str,
    lease_s: float,
    now: datetime,
) -> Job | None:
    """In one write transaction: the first job matching `conditions` in the policy's order, locked,
    then claimed by one UPDATE."""
    with write(session):
        plan = plan_claim(session, policy, now=now)
        job_id = first_claimable(session, plan, conditions)
        if job_id is None or (
            plan.devices_limited and not within_device_quota(session, policy.quotas, job_id)
        ):
            return None
        # Stamped now, after the reads that saw the queue as it is (a claim may have waited for
        # SQLite's write lock while a job ended): a job never starts before the one it waited for ended.
        claimed_at = utcnow()
        job = session.scalars(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.queued)
            .values(
                status=JobStatus.running,
                worker_id=worker_id,
                attempts=Job.attempts + 1,
                started_at=func.coalesce(Job.started_at, claimed_at),
                lease_expires_at=claimed_at + timedelta(seconds=lease_s),
                updated_at=claimed_at,
                not_before=None,
                reserved_by=None,
                reserved_at=None,
            )
            .returning(Job)
            .execution_options(synchronize_session=False)
        ).one_or_none()
        if job is not None:  # the statement made the change: this writes its event
            transition(
                session,
                job,
                JobStatus.running,
                f"claimed by worker {worker_id} (attempt {job.attempts} of {job.max_attempts})",
                data={"worker_id": worker_id, "attempt": job.attempts},
                attempt=job.attempts,
                locked=True,  # the UPDATE above holds the row
                moved_from=JobStatus.queued,  # which the UPDATE's WHERE required
            )
    return job


# A backoff that ended this recently still counts as pending: the claim that ran a moment before the
# backoff ended found nothing, and the next loop's claim takes the job (a worker that asked after the
# end and before that claim once left a job behind, queued, and exited).
RETRY_GRACE_S = 5.0


def retry_pending(session: Session, *, max_processes: int | None = None) -> bool:
    """Whether a queued job (that fits) waits for its retry backoff, or left it a moment ago: a worker
    draining the queue (--exit-when-idle) waits for it rather than leave it behind."""
    since = utcnow() - timedelta(seconds=RETRY_GRACE_S)
    query = select(Job.id).where(Job.status == JobStatus.queued, Job.not_before > since)
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
            .where(*held_by(claim))
            .values(lease_expires_at=now + timedelta(seconds=lease_s))
            .returning(Job.status)
        ).one_or_none()
        session.execute(update(Worker).where(Worker.id == claim.worker_id).values(last_heartbeat_at=now))
    return status


def set_output_dir(
    session: Session, *, claim: Claim, output_dir: str, devices: Sequence[str] | None = None
) -> None:
    """Where the attempt writes, and the devices it holds (CUDA indices or CPU slots)."""
    values: dict[str, Any] = {"output_dir": output_dir}
    if devices is not None:
        values["devices"] = list(devices)
    with write(session):
        session.execute(update(Job).where(*held_by(claim)).values(**values))


def finish_job(
    session: Session,
    *,
    claim: Claim,
    status: JobStatus,
    error: str | None = None,
    result: dict[str, Any] | None = None,
    error_code: ErrorCode | None = None,
) -> bool:
    """Record a job's outcome (a finished status); False when the worker had lost the job (its
    lease expired). A move the lifecycle lacks (a status that is not an outcome; `failed` while
    cancelling, where a cancel wins: fail_job) is IllegalTransition, with nothing written."""
    if not status.is_terminal:
        raise IllegalTransition(f"job {claim.job_id}: {status} is not an outcome finish_job records")
    with write(session):
        job = current_job(session, claim)
        if job is None:
            return False
        check_move(job.id, job.status, status)  # before the row's fields change
        pruned = status == JobStatus.cancelled and job.error_code == ErrorCode.pruned
        if pruned:  # a search's pruner stopped it: it keeps saying so (jobs_repo.prune_job)
            error, error_code = job.error, ErrorCode.pruned
        job.lease_expires_at, job.error = None, error
        job.error_code = error_code if status == JobStatus.failed or pruned else None
        if result is not None:
            job.result = result
        code = f" [{error_code}]" if error_code and status == JobStatus.failed else ""
        transition(
            session,
            job,
            status,
            f"job {status}{code}" + (f": {error}" if error else ""),
            level="error" if status == JobStatus.failed else "info",
            data={"error_code": code.strip(" []") or (ErrorCode.pruned.value if pruned else None)},
            locked=True,  # _current took the row lock
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
        job = current_job(session, claim)
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
        job = current_job(session, claim, statuses=(JobStatus.running,))
        if job is None:
            return False
        job.worker_id, job.lease_expires_at, job.attempts = None, None, job.attempts - 1
        transition(session, job, JobStatus.queued, f"job requeued: {reason}")
    return True


# The words of a build's refusal (refuse_job): not a resource hand-back, never counted as one.
REFUSAL_WORDS = "handed back untouched"


def refuse_job(
    session: Session,
    *,
    claim: Claim,
    build: str,
    reason: str,
    missing: Sequence[str] = (),
) -> JobStatus | None:
    """The worker that claimed the job cannot run it (its build lacks a spec field the job uses, or
    cannot parse the spec: shared/jobspec/capability.py): the job goes back to the queue untouched,
    as if never claimed — no attempt spent, its error left as it was, claimable at once by another
    build — and an event says which build refused it and why. Not a resource hand-back: it never
    counts toward GLUEJOBS_MAX_RESOURCE_HANDBACKS. A cancel requested meanwhile wins. The job's
    status after it, or None when the claim was lost."""
    with write(session):
        job = current_job(session, claim)
        if job is None:
            return None
        message = f"worker {claim.worker_id} of {build} cannot run this job: {reason}"
        data: dict[str, Any] = {
            "refused_by": {"worker_id": claim.worker_id, "build": build},
            "reason": reason,
        }
        if missing:
            data["missing_fields"] = list(missing)
        job.lease_expires_at, job.worker_id, job.attempts = None, None, job.attempts - 1
        if job.attempts == 0:
            job.started_at = None  # it never started: the next build's claim stamps it
        if job.status == JobStatus.cancelling:
            transition(session, job, JobStatus.cancelled, f"job cancelled ({message})", data=data)
        else:
            transition(
                session,
                job,
                JobStatus.queued,
                f"{message}; {REFUSAL_WORDS}, no attempt spent",
                level="warning",
                data=data,
            )
        return job.status


# The words of a resource hand-back's event, which the hand-backs are counted by.
HANDBACK_WORDS = "no attempt spent"


def resource_handbacks(session: Session, *, job_id: int) -> int:
    """How often the job was handed back for want of a worker's disk or memory."""
    with read(session):
        return _count_handbacks(session, job_id)


def _count_handbacks(session: Session, job_id: int) -> int:
    """The job's state events that say it was handed back (a few rows, by the job's events index),
    inside the caller's transaction."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(JobEvent)
            .where(
                JobEvent.job_id == job_id,
                JobEvent.kind == STATE,
                JobEvent.message.like(f"%{HANDBACK_WORDS} (resource hand-back %"),
            )
        )
        or 0
    )


# What a resource hand-back's worker ran out of, by its error code (for the final reason).
_RESOURCE_NAMES = {ErrorCode.no_space: "disk", ErrorCode.out_of_memory: "memory"}


def hand_back_job(
    session: Session,
    *,
    claim: Claim,
    error_code: ErrorCode,
    error: str,
    max_handbacks: int,
    retry_base_s: float = 0.0,
    retry_cap_s: float = 0.0,
) -> JobStatus | None:
    """An attempt that died because its worker ran out of disk or memory (`error_code`): the
    worker's problem, not the job's. The job goes back to the queue without spending an attempt
    (after the usual backoff, so that a worker short of memory does not take it straight back);
    the hand-back past `max_handbacks` fails the job for good: it needs more than the workers have.
    A cancel requested meanwhile wins. The job's status after it, or None when the claim was lost.

    The count is the job's hand-back events (`resource_handbacks(…)`), not a column: a fleet
    mid-upgrade runs this release beside the previous one on the previous schema."""
    with write(session):
        job = current_job(session, claim)
        if job is None:
            return None
        count = _count_handbacks(session, job.id) + 1
        first_line = error.splitlines()[0] if error else str(error_code)
        cause = f"attempt {claim.attempt} handed back [{error_code}]: {first_line}"
        now = utcnow()
        job.error, job.error_code, job.lease_expires_at = error, error_code, None
        if job.status == JobStatus.cancelling:
            transition(session, job, JobStatus.cancelled, f"job cancelled ({cause})", now=now)
        elif count > max_handbacks:
            what = _RESOURCE_NAMES.get(error_code, "room")
            job.error = (
                f"the job needs more {what} than the workers have: its attempts were handed back "
                f"{max_handbacks} time(s) for it (GLUEJOBS_MAX_RESOURCE_HANDBACKS), and then: {error}"
            )
            transition(
                session,
                job,
                JobStatus.failed,
                f"job failed [{error_code}]: {job.error}",
                level="error",
                data={"error_code": error_code, "resource_handbacks": count},
                now=now,
            )
        else:
            delay = retry_delay_s(count, base_s=retry_base_s, cap_s=retry_cap_s)
            job.worker_id, job.attempts = None, job.attempts - 1
            job.not_before = now + timedelta(seconds=delay) if delay > 0 else None
            transition(
                session,
                job,
                JobStatus.queued,
                f"{cause}; {HANDBACK_WORDS} (resource hand-back {count} of {max_handbacks}), "
                f"retrying in {delay:.0f}s from the newest checkpoint",
                level="warning",
                data={"error_code": error_code, "resource_handbacks": count, "retry_in_s": delay},
            )
        return job.status


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
        transition(session, job, JobStatus.cancelled, f"job cancelled ({cause})", now=now)
    elif error_code.retryable and job.attempts < job.max_attempts:
        delay = retry_delay_s(job.attempts, base_s=retry_base_s, cap_s=retry_cap_s)
        job.worker_id = None
        job.not_before = now + timedelta(seconds=delay) if delay > 0 else None
        transition(
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
        transition(
            session,
            job,
            JobStatus.failed,
            f"job failed [{error_code}]: {job.error}",
            level="error",
            data={"error_code": error_code},
            now=now,
        )
