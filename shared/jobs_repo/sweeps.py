"""Sweeps (one job per combination of seeds and grid values) and what the sweep pages and the
leaderboard read: finished jobs and their evaluation rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.errors import Conflict
from shared.core.ownership import _newest_first, _owned
from shared.core.tables import Job, JobMetric, JobStatus, Sweep, utcnow
from shared.jobs_repo.jobs import _add_job, _cancel
from shared.jobspec.tasks import EVAL_MISMATCHED_SPLIT, EVAL_SPLIT
from shared.scheduling.quotas import QuotaDefaults, check_queued


@dataclass(frozen=True)
class SweepJob:
    spec: dict[str, Any]
    configuration: str  # e.g. "learning_rate=0.0001 seed=3", for the job's metadata
    warnings: tuple[str, ...] = ()
    grid_values: dict[str, Any] = field(default_factory=dict)  # the grid values it was made of, as sent


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
    actor: dict[str, Any] | None = None,
    quotas: QuotaDefaults | None = None,
) -> tuple[Sweep, list[Job]]:
    """The sweep and all its jobs in one transaction: either every combination is queued or none
    (with `quotas`: none when they would take the owner past max_queued, OverQuota)."""
    metadata = metadata or {}
    with write(session):
        if quotas is not None:
            check_queued(session, owner=owner, adding=len(jobs), defaults=quotas)
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
                actor=actor,
                sweep_id=sweep.id,
                warnings=list(job.warnings),
            )
            for job in jobs
        ]
    return sweep, created


def get_sweep(session: Session, *, sweep_id: int, owner: str | None = None) -> Sweep:
    """The sweep, or NotFound. With `owner` set, another key's sweep is not found either."""
    with read(session):
        return _owned(session, Sweep, sweep_id, owner)


def list_sweeps(
    session: Session, *, after: int | None = None, limit: int = 20, owner: str | None = None
) -> tuple[list[Sweep], bool]:
    """Newest first; `after` is the id of the last sweep of the previous page."""
    return _newest_first(session, select(Sweep), Sweep, after=after, limit=limit, owner=owner)


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


def cancel_sweep(
    session: Session, *, sweep_id: int, owner: str | None = None, actor: dict[str, Any] | None = None
) -> list[Job]:
    """Cancel the sweep's unfinished jobs as POST /v1/jobs/{id}/cancel would; its jobs afterwards.

    Conflict when every job had already finished.
    """
    now = utcnow()
    with write(session):
        _owned(session, Sweep, sweep_id, owner)
        # The jobs' locks before the sweep's, the order a job's end takes them (its sweep.finished
        # webhook event locks the sweep): the two orders never meet, so they never deadlock.
        jobs = list(
            session.scalars(select(Job).where(Job.sweep_id == sweep_id).order_by(Job.id).with_for_update())
        )
        sweep = _owned(session, Sweep, sweep_id, owner, lock=True)
        unfinished = [job for job in jobs if not job.status.is_terminal]
        if not unfinished:
            raise Conflict(f"sweep {sweep_id} has already finished: all its {len(jobs)} jobs have ended")
        sweep.cancel_requested_at = sweep.cancel_requested_at or now
        for job in unfinished:
            _cancel(session, job, now, actor)
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
