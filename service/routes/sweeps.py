"""/v1/sweeps: one job per combination of seeds and grid values, and statistics over the seeds."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status

from service.deps import After, DataScopeDep, PrincipalDep, SessionDep, SettingsDep, SweepDep
from service.schemas.common import ErrorResponse, Page
from service.schemas.sweeps import SweepCreate, SweepPlan, SweepPlanJob, SweepPublic
from shared import jobs_repo
from shared.admission.job_checks import check_priority
from shared.core.tables import Job, JobStatus, Sweep
from shared.research.sweep_stats import job_counts, main_metric, sweep_results, sweep_status
from shared.research.sweeps import resolve_sweep
from shared.scheduling.quotas import QuotaDefaults

router = APIRouter(prefix="/sweeps", tags=["sweeps"])


def sweep_public(sweep: Sweep, jobs: list[Job], *, results: dict[str, Any] | None = None) -> SweepPublic:
    return SweepPublic.model_validate(
        {
            "id": sweep.id,
            "status": sweep_status(
                [j.status for j in jobs], cancel_requested=sweep.cancel_requested_at is not None
            ),
            "spec": sweep.spec,
            "seeds": sweep.seeds,
            "grid": sweep.grid,
            "metadata": sweep.metadata_,
            "created_at": sweep.created_at,
            "cancel_requested_at": sweep.cancel_requested_at,
            "job_ids": [j.id for j in jobs],
            "job_counts": job_counts(jobs),
            "main_metric": results["main_metric"] if results else main_metric(sweep.spec, jobs),
            "warnings": list(dict.fromkeys(w for job in jobs for w in job.warnings or [])),
            **({"configurations": results["configurations"], "winner": results["winner"]} if results else {}),
        }
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SweepPublic | SweepPlan,
    responses={
        200: {"model": SweepPlan, "description": "dry_run=true: the jobs it would queue; nothing stored"}
    },
)
def create_sweep(
    body: SweepCreate,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    scope: DataScopeDep,
    response: Response,
    dry_run: Annotated[
        bool, Query(description="Check every combination without storing anything: 200 with their specs")
    ] = False,
) -> SweepPublic | SweepPlan:
    """Queue one ordinary job per combination of `grid` values and `seeds`.

    Each combination is checked as POST /v1/jobs checks a job; one that cannot run refuses the whole
    sweep with 422 naming it, and nothing is stored. Each job's metadata names its sweep. The stored
    spec and grid hold the values with their types (a grid value "1e-4" is stored as 0.0001). With
    `dry_run=true` the answer is each combination's resolved spec and warnings, and nothing is stored.
    """
    check_priority(body.priority, settings, is_admin=principal.is_admin)
    resolved = resolve_sweep(body.spec, body.seeds, body.grid, settings, scope=scope)
    if dry_run:
        response.status_code = status.HTTP_200_OK
        return SweepPlan(
            spec=resolved.spec,
            grid=resolved.grid,
            seeds=resolved.seeds,
            jobs=[
                SweepPlanJob(configuration=job.configuration, spec=job.spec, warnings=list(job.warnings))
                for job in resolved.jobs
            ],
        )
    sweep, created = jobs_repo.create_sweep(
        session,
        spec=resolved.spec,
        seeds=resolved.seeds,
        grid=resolved.grid,
        jobs=resolved.jobs,
        priority=body.priority,
        metadata=body.metadata,
        max_attempts=body.max_attempts,
        owner=principal.owner,
        actor=principal.actor,
        quotas=QuotaDefaults.from_settings(settings),
    )
    return sweep_public(sweep, created)


@router.get("", response_model=Page[SweepPublic])
def read_sweeps(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 20,
    after: After = None,
) -> dict[str, Any]:
    """Sweeps, newest first, in cursor pages (without per-configuration statistics)."""
    sweeps, has_more = jobs_repo.list_sweeps(session, after=after, limit=limit, owner=principal.owner_filter)
    jobs = jobs_repo.list_sweep_jobs(session, sweep_ids=[s.id for s in sweeps])
    by_sweep: dict[int, list[Job]] = {}
    for job in jobs:
        by_sweep.setdefault(job.sweep_id or 0, []).append(job)
    return {
        "data": [sweep_public(s, by_sweep.get(s.id, [])) for s in sweeps],
        "has_more": has_more,
        "next_cursor": str(sweeps[-1].id) if has_more and sweeps else None,
    }


@router.get("/{sweep_id}", response_model=SweepPublic)
def read_sweep(sweep: SweepDep, session: SessionDep) -> SweepPublic:
    """The sweep's status and, per configuration, median/mean/std/min/max over seeds of every
    evaluation metric at the best and the final evaluation; the winning configuration."""
    jobs = jobs_repo.list_sweep_jobs(session, sweep_ids=[sweep.id])
    rows = jobs_repo.list_eval_metrics(
        session, job_ids=[j.id for j in jobs if j.status == JobStatus.succeeded]
    )
    return sweep_public(sweep, jobs, results=sweep_results(sweep, jobs, rows))


@router.post(
    "/{sweep_id}/cancel",
    response_model=SweepPublic,
    responses={
        202: {"model": SweepPublic, "description": "Some jobs were running: their workers will stop them"},
        409: {"model": ErrorResponse},
    },
)
def cancel_sweep(
    sweep: SweepDep, session: SessionDep, principal: PrincipalDep, response: Response
) -> SweepPublic:
    """Cancel the sweep's unfinished jobs (queued at once, running ones by their workers); finished
    jobs keep their results. 409 when every job had already finished."""
    jobs = jobs_repo.cancel_sweep(
        session, sweep_id=sweep.id, owner=principal.owner_filter, actor=principal.actor
    )
    if any(job.status == JobStatus.cancelling for job in jobs):
        response.status_code = status.HTTP_202_ACCEPTED
    return sweep_public(jobs_repo.get_sweep(session, sweep_id=sweep.id), jobs)
