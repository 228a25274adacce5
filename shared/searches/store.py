"""Every read and write of searches and their trials, each in its own short transaction (as
shared/jobs_repo does for jobs). A trial's job is created by jobs_repo's own `_add_job`, with the
owner's queued-jobs quota checked in the same transaction, and stopped by its cancel path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.errors import Conflict
from shared.core.ownership import _newest_first, _owned
from shared.core.tables import Job, JobEvent, JobMetric, Search, SearchStatus, SearchTrial, utcnow
from shared.jobs_repo import SweepJob, prune_job
from shared.jobs_repo.jobs import _add_job, _cancel
from shared.jobspec.tasks import EVAL_SPLIT
from shared.scheduling.quotas import QuotaDefaults, check_queued
from shared.webhooks import search_finished


@dataclass(frozen=True)
class NewTrial:
    number: int
    params: dict[str, Any]
    job: SweepJob  # its resolved spec and warnings


@dataclass(frozen=True)
class TrialUpdate:
    """What one driver step learnt about a trial."""

    number: int
    state: str
    value: float | None
    intermediate: dict[str, float]
    system_attrs: dict[str, Any]
    pruned: dict[str, Any] | None


def create_search(
    session: Session,
    *,
    search: Search,
    trials: Sequence[NewTrial],
    actor: dict[str, Any] | None = None,
    quotas: QuotaDefaults | None = None,
) -> tuple[Search, list[SearchTrial]]:
    """The search and its first trials (their jobs queued) in one transaction: all or nothing."""
    with write(session):
        if quotas is not None:
            check_queued(session, owner=search.owner, adding=len(trials), defaults=quotas)
        session.add(search)
        session.flush()
        rows = [_add_trial(session, search, trial, actor) for trial in trials]
    return search, rows


def add_trials(
    session: Session,
    *,
    search_id: int,
    driver_id: str,
    trials: Sequence[NewTrial],
    quotas: QuotaDefaults | None = None,
) -> int:
    """Queue more trials while this driver holds the search and no cancel was asked for; how many
    were added (OverQuota, nothing added, when the owner's queue is full)."""
    with write(session):
        search = session.get(Search, search_id, with_for_update=True)
        if search is None or search.driver_id != driver_id or search.cancel_requested_at is not None:
            return 0
        if quotas is not None:
            check_queued(session, owner=search.owner, adding=len(trials), defaults=quotas)
        for trial in trials:
            _add_trial(session, search, trial, None)
        search.note = None
    return len(trials)


def _add_trial(
    session: Session, search: Search, trial: NewTrial, actor: dict[str, Any] | None
) -> SearchTrial:
    job = _add_job(
        session,
        spec=trial.job.spec,
        priority=search.priority,
        metadata={
            **search.metadata_,
            "search_id": str(search.id),
            "search_trial": trial.number,
            "search_configuration": trial.job.configuration,
        },
        max_attempts=search.max_attempts,
        owner=search.owner,
        actor=actor,
        warnings=list(trial.job.warnings),
    )
    row = SearchTrial(
        search_id=search.id,
        number=trial.number,
        job_id=job.id,
        params=trial.params,
        state="running",
        intermediate={},
        system_attrs={},
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def get_search(session: Session, *, search_id: int, owner: str | None = None) -> Search:
    """The search, or NotFound (also another owner's, with `owner` set)."""
    with read(session):
        return _owned(session, Search, search_id, owner)


def list_searches(
    session: Session, *, after: int | None = None, limit: int = 20, owner: str | None = None
) -> tuple[list[Search], bool]:
    return _newest_first(session, select(Search), Search, after=after, limit=limit, owner=owner)


def list_trials(session: Session, *, search_ids: Sequence[int]) -> list[SearchTrial]:
    if not search_ids:
        return []
    query = select(SearchTrial).where(SearchTrial.search_id.in_(search_ids))
    with read(session):
        return list(session.scalars(query.order_by(SearchTrial.search_id, SearchTrial.number)))


def list_jobs(session: Session, *, job_ids: Sequence[int]) -> dict[int, Job]:
    if not job_ids:
        return {}
    with read(session):
        return {job.id: job for job in session.scalars(select(Job).where(Job.id.in_(job_ids)))}


def trials_of_jobs(session: Session, *, job_ids: Sequence[int]) -> dict[int, SearchTrial]:
    """Of these jobs, those that are a search's trials: their trial rows (search, number, where a
    pruned one was stopped), by job id. One query for a page of jobs."""
    if not job_ids:
        return {}
    with read(session):
        query = select(SearchTrial).where(SearchTrial.job_id.in_(job_ids))
        return {trial.job_id: trial for trial in session.scalars(query) if trial.job_id is not None}


# The training loop announces its schedule in one event (worker/training/reporter.py's log_schedule).
SCHEDULE_EVENT = "training: %"


def planned_steps(session: Session, *, job_ids: Sequence[int]) -> dict[int, int]:
    """The optimizer steps each job's training loop planned (as it announced them), by job id; a job
    that has not started training has none."""
    if not job_ids:
        return {}
    query = select(JobEvent.job_id, JobEvent.data).where(
        JobEvent.job_id.in_(job_ids), JobEvent.message.like(SCHEDULE_EVENT)
    )
    planned: dict[int, int] = {}
    with read(session):
        for job_id, data in session.execute(query.order_by(JobEvent.id)):
            steps = (data or {}).get("max_train_steps")
            if isinstance(steps, int):
                planned[job_id] = steps  # the latest attempt's
    return planned


def objective_rows(session: Session, *, job_ids: Sequence[int], metric: str) -> dict[int, list[JobMetric]]:
    """Each job's evaluation rows of the objective's metric, in step order (one per evaluation: rows
    are keyed so that a resumed attempt does not repeat them)."""
    if not job_ids:
        return {}
    query = (
        select(JobMetric)
        .where(JobMetric.job_id.in_(job_ids), JobMetric.split == EVAL_SPLIT, JobMetric.name == metric)
        .order_by(JobMetric.job_id, JobMetric.step, JobMetric.id)
    )
    found: dict[int, list[JobMetric]] = {}
    with read(session):
        for row in session.scalars(query):
            rows = found.setdefault(row.job_id, [])
            if not rows or rows[-1].step != row.step:
                rows.append(row)
    return found


def cancel_search(
    session: Session, *, search_id: int, owner: str | None = None, actor: dict[str, Any] | None = None
) -> Search:
    """No more trials; every unfinished trial's job cancelled as POST /v1/jobs/{id}/cancel cancels
    it. Its driver marks it cancelled once they have all stopped. Conflict when it had finished."""
    now = utcnow()
    with write(session):
        search = _owned(session, Search, search_id, owner, lock=True)
        if search.status != SearchStatus.running:
            raise Conflict(f"search {search_id} has already finished ({search.status})")
        job_ids = select(SearchTrial.job_id).where(SearchTrial.search_id == search_id)
        for job in session.scalars(select(Job).where(Job.id.in_(job_ids)).order_by(Job.id).with_for_update()):
            if not job.status.is_terminal:
                _cancel(session, job, now, actor, why=f"search {search_id} was cancelled")
        search.cancel_requested_at = search.cancel_requested_at or now
    return search


def active_search_ids(session: Session) -> list[int]:
    with read(session):
        query = select(Search.id).where(Search.status == SearchStatus.running).order_by(Search.id)
        return list(session.scalars(query))


def take_lease(session: Session, *, search_id: int, driver_id: str, lease_s: float) -> bool:
    """Whether this driver now holds the search for `lease_s`: it held it, or nobody did, or the
    holder's lease ran out (its API process stopped). One UPDATE, so two drivers cannot both win."""
    now = utcnow()
    statement = (
        update(Search)
        .where(
            Search.id == search_id,
            Search.status == SearchStatus.running,
            or_(Search.driver_id.is_(None), Search.driver_id == driver_id, Search.driver_lease_until < now),
        )
        .values(driver_id=driver_id, driver_lease_until=now + timedelta(seconds=lease_s))
    )
    with write(session):
        return session.execute(statement).rowcount == 1  # type: ignore[attr-defined]


def release_leases(session: Session, *, driver_id: str) -> None:
    """Hand back every search this driver holds (its API process is stopping): another takes them
    over at once instead of after the lease."""
    statement = (
        update(Search).where(Search.driver_id == driver_id).values(driver_id=None, driver_lease_until=None)
    )
    with write(session):
        session.execute(statement)


def save_progress(
    session: Session,
    *,
    search_id: int,
    driver_id: str,
    updates: Sequence[TrialUpdate],
    prunes: Sequence[tuple[int, str, dict[str, Any]]],
    best_trial: int | None,
    note: str | None = None,
) -> bool:
    """What a driver step learnt, in one transaction: trials' reports and ends, the prunes (each by
    jobs_repo.prune_job: the cancel path), the best trial. False (nothing written) when another
    driver holds the search now."""
    with write(session):
        search = session.get(Search, search_id, with_for_update=True)
        if search is None or search.driver_id != driver_id or search.status != SearchStatus.running:
            return False
        rows = {
            row.number: row
            for row in session.scalars(select(SearchTrial).where(SearchTrial.search_id == search_id))
        }
        now = utcnow()
        for change in updates:
            row = rows[change.number]
            row.intermediate, row.system_attrs, row.pruned = (
                change.intermediate,
                change.system_attrs,
                change.pruned,
            )
            if change.state != row.state:
                row.state, row.value, row.finished_at = change.state, change.value, now
        for job_id, why, data in prunes:
            prune_job(session, job_id=job_id, why=why, data=data)
        search.best_trial = best_trial
        if note is not None:
            search.note = note
    return True


def finish_search(session: Session, *, search_id: int, status: SearchStatus, note: str | None = None) -> bool:
    """The one place a search is marked finished (succeeded, failed or cancelled): every trial has
    ended. Where a "search finished" notification hooks in. False when it had already finished."""
    with write(session):
        search = session.get(Search, search_id, with_for_update=True)
        if search is None or search.status != SearchStatus.running:
            return False
        search.status, search.finished_at = status, utcnow()
        search.driver_id, search.driver_lease_until = None, None
        if note is not None:
            search.note = note
        # In the same transaction: the owner's webhooks hear of it exactly when it is recorded.
        data = {
            "status": str(status),
            "best_trial": search.best_trial,
            "best": _best_of(session, search),
            "objective": search.objective,
            "note": search.note,
        }
        search_finished(session, owner=search.owner, search_id=search.id, data=data)
    return True


def _best_of(session: Session, search: Search) -> dict[str, Any] | None:
    """The best trial as GET /v1/searches/{id} gives it ({number, job_id, params, value}): a webhook's
    reader acts on the winner (fetch its model, rerun it) without asking the API first."""
    if search.best_trial is None:
        return None
    trial = session.scalars(
        select(SearchTrial).where(SearchTrial.search_id == search.id, SearchTrial.number == search.best_trial)
    ).first()
    if trial is None or trial.value is None:
        return None
    return {"number": trial.number, "job_id": trial.job_id, "params": trial.params, "value": trial.value}


def set_note(session: Session, *, search_id: int, note: str) -> None:
    with write(session):
        search = session.get(Search, search_id, with_for_update=True)
        if search is not None:
            search.note = note


def cut_budget(session: Session, *, search_id: int, n_trials: int, note: str) -> None:
    """No more trials than `n_trials` (a drawn trial cannot run): the search ends with those it has."""
    with write(session):
        search = session.get(Search, search_id, with_for_update=True)
        if search is not None:
            search.n_trials, search.note = min(search.n_trials, n_trials), note


def link_seed_sweep(session: Session, *, search_id: int, sweep_id: int) -> None:
    with write(session):
        search = session.get(Search, search_id, with_for_update=True)
        if search is not None:
            search.seeds_sweep_id = sweep_id
