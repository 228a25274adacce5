"""A job's claim, and the fence every write of a job's process goes through."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.core.errors import NotFound, StaleClaim
from shared.core.tables import ACTIVE_STATUSES, Job, JobStatus


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


def current_job(
    session: Session, claim: Claim, *, statuses: Collection[JobStatus] = ACTIVE_STATUSES
) -> Job | None:
    """The job, locked, when `claim` is its current one and it is in one of `statuses`; else None
    (the worker has lost it: its lease expired and lease recovery or another worker moved on)."""
    job = _locked(session, claim.job_id)
    return job if job is not None and claim.holds(job, statuses) else None


def _locked(session: Session, job_id: int) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id).with_for_update()).one_or_none()


def held_by(claim: Claim) -> tuple[Any, ...]:
    """Claim.holds, as a WHERE clause."""
    return (
        Job.id == claim.job_id,
        Job.worker_id == claim.worker_id,
        Job.attempts == claim.attempt,
        Job.status.in_(ACTIVE_STATUSES),
    )
