"""A search's driver: one step reads its trials' new evaluations from job_metrics, reports them to
the pruner (stopping a trial it prunes by the cancel path), records trials that ended, asks the
sampler for new trials while the budget and the parallelism allow, and marks the search finished
once every trial has ended.

Each step starts from the database (the study is rebuilt, shared/searches/optimizer.py) and holds
the search by a lease (searches.driver_id, driver_lease_until), so any number of API processes may
run `drive_once` side by side: one drives a given search at a time, and when its process stops
another takes the search over.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from shared.admission.job_checks import spec_warnings
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.errors import InvalidSpec, OverQuota
from shared.core.tables import Job, JobStatus, Search, SearchStatus, SearchTrial
from shared.jobs_repo import SweepJob
from shared.jobspec.spec import JobSpec
from shared.scheduling.quotas import QuotaDefaults
from shared.searches import store
from shared.searches.config import Parameter
from shared.searches.optimizer import (
    COMPLETE,
    FAILED,
    PRUNED,
    RUNNING,
    Optimizer,
    TrialRecord,
    best_trial,
    best_value,
)

logger = logging.getLogger(__name__)

SPACE = TypeAdapter(dict[str, Parameter])


def drive_once(db: Database, settings: Settings, *, driver_id: str) -> int:
    """One step of every running search this driver can hold; how many it stepped."""
    stepped = 0
    with db.session() as session:
        for search_id in store.active_search_ids(session):
            if not store.take_lease(
                session, search_id=search_id, driver_id=driver_id, lease_s=settings.search_lease_s
            ):
                continue
            try:
                step(session, search_id=search_id, settings=settings, driver_id=driver_id)
                stepped += 1
            except Exception:  # one search's bug must not stop the others: logged, tried next time
                logger.exception("search %s: the driver's step failed", search_id)
                session.rollback()
    return stepped


def optimizer_for(search: Search, trials: list[TrialRecord]) -> Optimizer:
    return Optimizer(
        space=SPACE.validate_python(search.space),
        direction=search.objective["direction"],
        sampler=search.sampler,
        pruner=search.pruner,
        seed=search.seed,
        trials=trials,
    )


def record_of(row: SearchTrial) -> TrialRecord:
    return TrialRecord(
        number=row.number,
        params=row.params,
        state=row.state,
        value=row.value,
        intermediate={int(k): v for k, v in row.intermediate.items()},
        system_attrs=dict(row.system_attrs),
    )


def step(session: Session, *, search_id: int, settings: Settings, driver_id: str) -> None:
    search = store.get_search(session, search_id=search_id)
    rows = store.list_trials(session, search_ids=[search_id])
    open_rows = [row for row in rows if row.state == RUNNING]
    jobs = store.list_jobs(session, job_ids=[row.job_id for row in open_rows if row.job_id is not None])
    metric, direction = search.objective["metric"], search.objective["direction"]
    evaluations = store.objective_rows(session, job_ids=list(jobs), metric=metric)
    planned = store.planned_steps(session, job_ids=list(jobs))
    records = {row.number: record_of(row) for row in rows}
    optimizer = optimizer_for(search, list(records.values()))

    updates: list[store.TrialUpdate] = []
    prunes: list[tuple[int, str, dict[str, Any]]] = []
    for row in open_rows:
        job = jobs.get(row.job_id) if row.job_id is not None else None
        record = records[row.number]
        seen = len(record.intermediate)
        new = (evaluations.get(job.id, []) if job else [])[seen:]
        values = [(seen + i + 1, metric_row.value) for i, metric_row in enumerate(new)]
        may_prune = (
            job is not None
            and job.status == JobStatus.running
            and job.cancel_requested_at is None
            and row.pruned is None
            # A trial whose final evaluation is in ends on its own: pruning it would save nothing and
            # lose its finished value (a loaded worker's job can still be "running" then).
            and not (new and job.id in planned and new[-1].step >= planned[job.id])
        )
        at = optimizer.report(row.number, values, may_prune=may_prune)
        reported = values if at is None else values[: at - seen]
        record.intermediate.update(reported)
        pruned = row.pruned
        if at is not None and job is not None:
            where = new[at - seen - 1]
            pruned = {
                "evaluation": at,
                "epoch": where.epoch,
                "step": where.step,
                "metric": metric,
                "value": where.value,
                "pruner": search.pruner["type"],
            }
            why = (
                f"pruned by search {search.id} ({search.pruner['type']} pruner) at evaluation {at} "
                f"(epoch {where.epoch:g}, step {where.step}): {metric} {where.value:.4g}"
            )
            prunes.append((job.id, why, pruned))
        record.state, record.value = _ending(job, record, pruned, direction)
        updates.append(
            store.TrialUpdate(
                number=row.number,
                state=record.state,
                value=record.value,
                intermediate={str(k): v for k, v in record.intermediate.items()},
                system_attrs=optimizer.system_attrs(row.number),
                pruned=pruned,
            )
        )
    best = best_trial(records.values(), direction)
    if not store.save_progress(
        session,
        search_id=search_id,
        driver_id=driver_id,
        updates=updates,
        prunes=prunes,
        best_trial=best.number if best else None,
    ):
        return  # another driver holds it now
    for job_id, why, _ in prunes:
        logger.info("job %s: %s", job_id, why)
    still_open = sum(1 for r in records.values() if r.state == RUNNING)
    if search.cancel_requested_at is None and len(records) < search.n_trials:
        still_open += _ask(session, search, records, optimizer, still_open, settings, driver_id)
    if still_open == 0 and (search.cancel_requested_at is not None or len(records) >= search.n_trials):
        if search.cancel_requested_at is not None:
            status = SearchStatus.cancelled
        else:
            status = SearchStatus.succeeded if best is not None else SearchStatus.failed
        store.finish_search(session, search_id=search_id, status=status)
        logger.info("search %s finished: %s", search_id, status)


def _ending(
    job: Job | None, record: TrialRecord, pruned: dict[str, Any] | None, direction: str
) -> tuple[str, float | None]:
    """A trial's state and value from its job: complete with its best evaluation once the job
    succeeded; pruned when the job was stopped for the pruner; failed when it failed, was cancelled
    by hand, or succeeded without an evaluation of the objective."""
    if job is None:
        return FAILED, None
    if not job.status.is_terminal:
        return RUNNING, None
    if job.status == JobStatus.succeeded and record.intermediate:
        return COMPLETE, best_value(record.intermediate.values(), direction)
    if job.status == JobStatus.cancelled and pruned is not None:
        return PRUNED, None
    return FAILED, None


def _ask(
    session: Session,
    search: Search,
    records: dict[int, TrialRecord],
    optimizer: Optimizer,
    still_open: int,
    settings: Settings,
    driver_id: str,
) -> int:
    """Queue new trials up to the budget and the parallelism; how many."""
    wanted = min(search.n_trials - len(records), search.parallelism - still_open)
    trials: list[store.NewTrial] = []
    for _ in range(max(wanted, 0)):
        number, params = optimizer.ask()
        try:
            job = trial_job(search.spec, params)
        except (ValidationError, InvalidSpec) as exc:  # the checks at creation should prevent it
            note = f"trial {number} {params} cannot run, so no more trials are asked for: {exc}"
            store.cut_budget(session, search_id=search.id, n_trials=len(records) + len(trials), note=note)
            search.n_trials = len(records) + len(trials)
            break
        trials.append(store.NewTrial(number, params, job))
    if not trials:
        return 0
    try:
        added = store.add_trials(
            session,
            search_id=search.id,
            driver_id=driver_id,
            trials=trials,
            quotas=QuotaDefaults.from_settings(settings),
        )
    except OverQuota as exc:
        store.set_note(session, search_id=search.id, note=f"waiting for room in the queue: {exc.message}")
        return 0
    for trial in trials[:added]:
        records[trial.number] = TrialRecord(trial.number, trial.params)
    return added


def trial_job(base: dict[str, Any], params: dict[str, Any]) -> SweepJob:
    """A later trial's job spec: the stored base spec (checked with the caller's folders and data when
    the search was created, with every end of every range and every choice) with the drawn values,
    validated by the spec's rules."""
    spec = JobSpec.model_validate({**base, **params})
    configuration = " ".join([*(f"{k}={v}" for k, v in params.items()), f"seed={spec.seed}"])
    return SweepJob(spec.model_dump(mode="json"), configuration, tuple(spec_warnings(spec)), dict(params))
