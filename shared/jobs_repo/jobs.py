"""Jobs as the API creates, reads, lists and cancels them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Required, TypedDict, Unpack

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.errors import Conflict, NotFound
from shared.core.lifecycle import NEW
from shared.core.ownership import _newest_first, _owned
from shared.core.tables import ErrorCode, IdempotencyKey, Job, JobStatus, utcnow
from shared.jobs_repo.events import transition
from shared.jobs_repo.files import link_files
from shared.jobs_repo.models import link_model
from shared.scheduling.quotas import QuotaDefaults, check_queued

# How long POST /v1/jobs remembers an Idempotency-Key (at least the 24 hours the API promises).
IDEMPOTENCY_KEY_TTL_S = 48 * 3600.0
# What an idempotency conflict names as its field: the HTTP header that carried the key.
IDEMPOTENCY_HEADER = "Idempotency-Key"


class NewJob(TypedDict, total=False):
    """A new job's fields, as POST /v1/jobs takes them (only `spec` is required); one definition for
    every way to create a job."""

    spec: Required[dict[str, Any]]
    priority: int  # default 0
    metadata: dict[str, Any] | None
    max_attempts: int  # default 3
    owner: str | None
    warnings: list[str]  # what the API accepted with a word of warning
    # Who created it (service/accounts/auth.Principal.actor: owner, key label, key id), for its first event.
    actor: dict[str, Any] | None


def create_job(
    session: Session,
    *,
    rerun_of: int | None = None,
    quotas: QuotaDefaults | None = None,
    **job: Unpack[NewJob],
) -> Job:
    """A queued job; with `quotas`, OverQuota (nothing stored) when its owner's max_queued is reached."""
    with write(session):
        if quotas is not None:
            check_queued(session, owner=job.get("owner"), adding=1, defaults=quotas)
        return _add_job(session, rerun_of=rerun_of, **job)


def _add_job(
    session: Session, *, sweep_id: int | None = None, rerun_of: int | None = None, **new: Unpack[NewJob]
) -> Job:
    """A queued job and its first event, inside the caller's write transaction."""
    spec = new["spec"]
    job = Job(
        spec=spec,
        priority=new.get("priority", 0),
        metadata_=new.get("metadata") or {},
        max_attempts=new.get("max_attempts", 3),
        owner=new.get("owner"),
        status=JobStatus.queued,
        num_processes=int(spec.get("num_processes") or 1),
        latest_metrics={},
        sweep_id=sweep_id,
        rerun_of=rerun_of,
        warnings=new.get("warnings") or [],
    )
    session.add(job)
    session.flush()
    link_files(session, job=job, uploaded=spec.get("uploaded_files") or {})
    link_model(session, job=job, registered=spec.get("registered_model"))
    message = "job queued" if rerun_of is None else f"job queued (a rerun of job {rerun_of})"
    transition(session, job, JobStatus.queued, message, data=_by(new.get("actor")), moved_from=NEW)
    return job


def create_job_once(
    session: Session,
    *,
    key: str,
    request_hash: str,
    quotas: QuotaDefaults | None = None,
    **new: Unpack[NewJob],
) -> tuple[Job, bool]:
    """create_job under an Idempotency-Key: (the job, True) the first time; (the same job, False)
    when the owner repeats the key with the same request. Conflict when the key came with another
    request.

    Race-safe: two requests with one key both try to insert it; the unique (owner, key) constraint
    lets one commit, and the other's transaction (its job included) rolls back and reads the winner.
    """
    owner_key = new.get("owner") or ""  # NULL would not take part in the unique key
    for _ in range(3):
        existing = _idempotent_job(session, owner=owner_key, key=key, request_hash=request_hash)
        if existing is not None:
            return existing, False
        try:
            with write(session):
                # Expired keys go first, so that a key reused after its TTL starts afresh.
                cutoff = utcnow() - timedelta(seconds=IDEMPOTENCY_KEY_TTL_S)
                session.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < cutoff))
                if quotas is not None:  # a repeat of a stored request (above) is never refused
                    check_queued(session, owner=new.get("owner"), adding=1, defaults=quotas)
                job = _add_job(session, **new)
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
        return _owned(session, Job, job_id, owner)


def list_jobs(
    session: Session,
    *,
    statuses: Sequence[JobStatus] = (),
    after: int | None = None,
    limit: int = 20,
    owner: str | None = None,
) -> tuple[list[Job], bool]:
    """Newest first; `after` is the id of the last job of the previous page."""
    query = select(Job)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    return _newest_first(session, query, Job, after=after, limit=limit, owner=owner)


def find_job(session: Session, *, job_id: int) -> Job | None:
    with read(session):
        return session.get(Job, job_id)


def request_cancel(
    session: Session, *, job_id: int, owner: str | None = None, actor: dict[str, Any] | None = None
) -> Job:
    """Queued jobs are cancelled at once; running ones become `cancelling` until their worker stops
    them. `actor` (who asked) goes into the event that says so."""
    with write(session):
        job = _owned(session, Job, job_id, owner, lock=True)
        if job.status.is_terminal:
            raise Conflict(f"job {job_id} has already finished ({job.status})")
        _cancel(session, job, utcnow(), actor)
    return job


def _cancel(
    session: Session,
    job: Job,
    now: datetime,
    actor: dict[str, Any] | None = None,
    *,
    why: str | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """The cancel path, inside the caller's write transaction (`job` locked). `why` and `data` say
    more in its event (a search's pruner: at which evaluation, with which value)."""
    data = {**(_by(actor) or {}), **(data or {})} or None
    if job.status == JobStatus.queued:
        message = "job cancelled before it started"
        transition(
            session, job, JobStatus.cancelled, f"{message}: {why}" if why else message, now=now, data=data
        )
    elif job.status == JobStatus.running:
        message = "cancellation requested"
        transition(
            session, job, JobStatus.cancelling, f"{message}: {why}" if why else message, now=now, data=data
        )
    job.cancel_requested_at = job.cancel_requested_at or now


def prune_job(session: Session, *, job_id: int, why: str, data: dict[str, Any]) -> bool:
    """Stop a search's trial early by the cancel path (its worker stops it as it stops a cancelled
    job), inside the caller's write transaction. The job keeps error_code `pruned` and `why` as its
    error, so its status (cancelled) says why; False when it had already finished or been cancelled."""
    job = session.get(Job, job_id, with_for_update=True)
    if job is None or job.status.is_terminal or job.cancel_requested_at is not None:
        return False
    _cancel(session, job, utcnow(), why=why, data={"pruned": data})
    job.error, job.error_code = why, ErrorCode.pruned
    return True


def _by(actor: dict[str, Any] | None) -> dict[str, Any] | None:
    """An event's data naming who acted (never a secret: the principal's owner, key label and id)."""
    return {"actor": actor} if actor else None
