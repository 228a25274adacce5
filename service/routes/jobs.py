"""/v1/jobs: submit, read, list and cancel jobs; read their metrics, checkpoints and events."""

from __future__ import annotations

from functools import partial
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Query, Request, Response, status
from pydantic import ValidationError, WithJsonSchema

from service import cursor_pages
from service.deps import (
    After,
    DatabaseDep,
    DataScopeDep,
    JobDep,
    JobId,
    PrincipalDep,
    SessionDep,
    SettingsDep,
)
from service.dry_run.plan import plan_job
from service.edge.spec_route import SpecCheckedRoute
from service.idempotency import request_hash
from service.job_views import for_user, job_view, job_views
from service.research.reproduction import compare_runs
from service.schemas.common import ErrorResponse, Page
from service.schemas.job_progress import CheckpointList, CheckpointPublic, EventPublic, MetricPublic
from service.schemas.jobs import JobCreate, JobPlan, JobPublic
from service.user_views import checkpoint_path
from shared import jobs_repo
from shared.admission.job_checks import check_job_spec, check_priority
from shared.core.artifact_links import download_command
from shared.core.errors import Conflict, InvalidRequest, quote
from shared.core.tables import JobStatus
from shared.jobspec import validation_messages
from shared.jobspec.spec import JobSpec
from shared.scheduling.quotas import QuotaDefaults

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=SpecCheckedRoute)

# A status name, documented as the enum it is; parsed by _parse_statuses, which also takes the
# comma-separated form ("queued,running") and names the field in its error.
StatusName = Annotated[str, WithJsonSchema({"type": "string", "enum": [s.value for s in JobStatus]})]
Limit = Annotated[int, Query(ge=1, le=100, description="Page size")]
RowLimit = Annotated[int, Query(ge=1, le=10_000, description="Rows per page")]
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias=jobs_repo.IDEMPOTENCY_HEADER,
        min_length=1,
        max_length=255,
        description="Any unique string (a UUID); a retried request with it returns the first one's job",
    ),
]


def _page(
    items: list[JobPublic] | list[MetricPublic] | list[EventPublic], ids: list[int], has_more: bool
) -> dict:
    return {"data": items, "has_more": has_more, "next_cursor": str(ids[-1]) if has_more and ids else None}


def _parse_statuses(values: list[str]) -> list[JobStatus]:
    names = [name.strip() for value in values for name in value.split(",")]
    # An empty name (`?status=`, `queued,`) is no status: refused like any unknown one, as the schema says.
    unknown = [name for name in names if name not in JobStatus.__members__]
    if unknown:
        raise InvalidRequest(
            f"unknown status {quote(unknown[0])}; expected one of {', '.join(JobStatus)}", field="status"
        )
    return [JobStatus(name) for name in names]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobPublic | JobPlan,
    responses={
        200: {
            "model": JobPublic | JobPlan,
            "description": "dry_run=true: the plan, nothing stored; or a repeated Idempotency-Key: the "
            "job it created",
        },
        409: {"model": ErrorResponse, "description": "The Idempotency-Key was used with another body"},
    },
)
def create_job(
    body: JobCreate,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    scope: DataScopeDep,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
    dry_run: Annotated[
        bool, Query(description="Check and plan the job without storing it: 200 with the plan")
    ] = False,
) -> JobPublic | JobPlan:
    """Queue a fine-tuning job. The answer holds the resolved spec: defaults filled in, seed recorded.

    A spec that cannot run (unknown task or field, bad values, paths that leave their folders, data
    files that are missing, lack the task's columns or hold labels that do not fit it …) is refused
    with 422 naming the field, and nothing is stored. With `dry_run=true` the answer is the plan:
    data checks, steps, warmup, evaluations, tokenised lengths and padding, a memory estimate.
    With an `Idempotency-Key`, repeating the request returns the job it created (200) instead of
    queuing another; the same key with a different body is refused with 409. With API keys, data
    paths resolve in the key owner's folder, GLUEJOBS_DATA_DIR/owners/<owner>/ (admin keys: anywhere
    under GLUEJOBS_DATA_DIR). At most GLUEJOBS_MAX_DRY_RUNS dry runs are planned at once: more get
    429 with Retry-After.
    """
    check_priority(body.priority, settings, is_admin=principal.is_admin)
    warnings: list[str] = []
    if dry_run:
        with request.app.state.dry_runs.slot(principal.owner):
            scope = scope.without_pins()  # nothing is stored: a job:N model it names is not pinned
            spec = check_job_spec(body.spec, settings, scope=scope, read_data=False, warnings=warnings)
            plan = plan_job(spec.with_seed(), settings, scope=scope)
            response.status_code = status.HTTP_200_OK
            return JobPlan.model_validate({**plan, "warnings": [*warnings, *plan["warnings"]]})
    spec = check_job_spec(body.spec, settings, scope=scope, warnings=warnings).with_seed()
    if idempotency_key is not None:
        job, created = jobs_repo.create_job_once(
            session,
            key=idempotency_key,
            request_hash=request_hash(body),
            spec=spec.model_dump(mode="json"),
            priority=body.priority,
            metadata=body.metadata,
            max_attempts=body.max_attempts,
            owner=principal.owner,
            actor=principal.actor,
            warnings=warnings,
            quotas=QuotaDefaults.from_settings(settings),
        )
        if not created:
            response.status_code = status.HTTP_200_OK
        return job_view(session, settings, job, principal)
    job = jobs_repo.create_job(
        session,
        spec=spec.model_dump(mode="json"),
        priority=body.priority,
        metadata=body.metadata,
        max_attempts=body.max_attempts,
        owner=principal.owner,
        actor=principal.actor,
        warnings=warnings,
        quotas=QuotaDefaults.from_settings(settings),
    )
    return job_view(session, settings, job, principal)


@router.get("", response_model=Page[JobPublic])
def read_jobs(
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    status_filter: Annotated[
        list[StatusName] | None,
        Query(
            alias="status", description="Only these statuses (repeat the parameter, or comma-separate them)"
        ),
    ] = None,
    limit: Limit = 20,
    after: After = None,
) -> dict:
    """Jobs, newest first, in cursor pages."""
    jobs, has_more = jobs_repo.list_jobs(
        session,
        statuses=_parse_statuses(status_filter or []),
        after=after,
        limit=limit,
        owner=principal.owner_filter,
    )
    return _page(job_views(session, settings, jobs, principal), [j.id for j in jobs], has_more)


@router.get("/{job_id}", response_model=JobPublic)
def read_job(job: JobDep, session: SessionDep, settings: SettingsDep, principal: PrincipalDep) -> JobPublic:
    """One job: status, resolved spec, attempts, worker, timestamps, error, output_dir, metrics, its
    reproducibility record; a rerun also says whether it reproduced the original's metrics.

    With a non-admin key, `output_dir` and `result.model_dir` are the job's API path
    (`/v1/jobs/{id}/artifacts`), and the record's file paths are named as the spec named them; an
    admin key reads where the worker stored them."""
    public = job_view(session, settings, job, principal)
    if job.rerun_of is not None:
        original = jobs_repo.find_job(session, job_id=job.rerun_of)
        if original is not None:
            public.reproduction = compare_runs(original, job)
            if not principal.is_admin:
                public = for_user(settings, job, public)
    return public


@router.post(
    "/{job_id}/rerun",
    status_code=status.HTTP_201_CREATED,
    response_model=JobPublic,
    responses={409: {"model": ErrorResponse}},
)
def rerun_job(
    job: JobDep, session: SessionDep, settings: SettingsDep, scope: DataScopeDep, principal: PrincipalDep
) -> JobPublic:
    """Queue the job's exact spec again (same seed), to check that its result can be repeated.

    Once both have finished, GET /v1/jobs/{rerun id} says whether the metrics matched. The spec goes
    through every check a new job does (the data is read again: a file may have gone or changed
    since; the reproducibility records show which): 422 naming the field when it would be refused
    now (a tracker no longer served, a file gone or not the caller's), 409 when this version no
    longer reads the stored spec.
    """
    check_priority(job.priority, settings, is_admin=principal.is_admin)
    warnings: list[str] = []
    try:
        check_job_spec(JobSpec.model_validate(job.spec), settings, scope=scope, warnings=warnings)
    except ValidationError as exc:  # a spec stored by an older version that this one refuses
        problem = validation_messages.problem(exc, prefix="spec")
        raise Conflict(f"job {job.id}'s spec is no longer accepted: {problem.line()}") from exc
    metadata = {k: v for k, v in job.metadata_.items() if not k.startswith("sweep_")}
    rerun = jobs_repo.create_job(
        session,
        spec=dict(job.spec),  # the stored spec itself: the rerun must not differ by a default
        priority=job.priority,
        metadata={**metadata, "rerun_of": str(job.id)},
        max_attempts=job.max_attempts,
        owner=job.owner,  # an admin's rerun stays its owner's job; the event names the admin
        actor=principal.actor,
        rerun_of=job.id,
        warnings=warnings,
        quotas=QuotaDefaults.from_settings(settings),
    )
    return job_view(session, settings, rerun, principal)


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses={
        202: {"model": JobPublic, "description": "Running: the worker will stop it"},
        409: {"model": ErrorResponse},
    },
)
def cancel_job(
    job: JobDep, session: SessionDep, settings: SettingsDep, principal: PrincipalDep, response: Response
) -> JobPublic:
    """Cancel a job: a queued job at once (200), a running one by its worker (202, `cancelling`).

    409 when the job has already finished.
    """
    cancelled = jobs_repo.request_cancel(
        session, job_id=job.id, owner=principal.owner_filter, actor=principal.actor
    )
    if cancelled.status == JobStatus.cancelling:
        response.status_code = status.HTTP_202_ACCEPTED
    return job_view(session, settings, cancelled, principal)


@router.get("/{job_id}/metrics", response_model=Page[MetricPublic])
async def read_job_metrics(
    job_id: JobId,
    database: DatabaseDep,
    principal: PrincipalDep,
    after: After = None,
    limit: RowLimit = 1000,
    split: Annotated[str | None, Query(description="train, eval or eval_mismatched")] = None,
    name: Annotated[str | None, Query(description="e.g. loss, accuracy")] = None,
) -> Response:
    """Metric rows in the order they were written; poll with `after=<next_cursor>`."""
    # One thread call, and the page serialised once (service/cursor_pages.py): a poll's cost.
    read = partial(
        cursor_pages.metrics_page,
        database,
        job_id=job_id,
        owner=principal.owner_filter,
        after=after,
        limit=limit,
        split=split,
        name=name,
    )
    return await anyio.to_thread.run_sync(read)


@router.get("/{job_id}/checkpoints", response_model=CheckpointList)
def read_job_checkpoints(job: JobDep, session: SessionDep, principal: PrincipalDep) -> CheckpointList:
    """The job's saved checkpoints (those save_total_limit kept), oldest first: `path` is the
    checkpoint's API path (an admin key: where the worker stored it), `download` the command."""
    rows = jobs_repo.list_checkpoints(session, job_id=job.id)
    return CheckpointList(
        data=[
            CheckpointPublic.model_validate(r).model_copy(
                update={
                    "download": download_command(job.id, checkpoint=r.step),
                    **({} if principal.is_admin else {"path": checkpoint_path(job.id, r.step)}),
                }
            )
            for r in rows
        ]
    )


@router.get("/{job_id}/events", response_model=Page[EventPublic])
async def read_job_events(
    job_id: JobId, database: DatabaseDep, principal: PrincipalDep, after: After = None, limit: RowLimit = 1000
) -> Response:
    """State changes and log lines, oldest first; poll with `after=<next_cursor>`."""
    read = partial(
        cursor_pages.events_page,
        database,
        job_id=job_id,
        owner=principal.owner_filter,
        after=after,
        limit=limit,
    )
    return await anyio.to_thread.run_sync(read)
