"""/v1/submissions: several jobs' GLUE prediction files bundled into the zip GLUE's site accepts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.deps import PrincipalDep, SessionDep
from service.schemas import ErrorResponse
from shared import jobs_repo
from shared.errors import InvalidRequest
from shared.glue_submission import JobFiles, bundle_submission

router = APIRouter(prefix="/submissions", tags=["submissions"])

MAX_BUNDLE_JOBS = 20


def parse_job_ids(values: list[str]) -> list[int]:
    """`jobs=1,2,3` or `jobs=1&jobs=2`: job ids, in the order given, each once."""
    ids: list[int] = []
    for part in (p.strip() for value in values for p in value.split(",")):
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise InvalidRequest(f"{part!r} is not a job id", field="jobs")
        if int(part) not in ids:
            ids.append(int(part))
    if not ids:
        raise InvalidRequest("name the jobs to bundle: jobs=1,2,3", field="jobs")
    if len(ids) > MAX_BUNDLE_JOBS:
        raise InvalidRequest(f"at most {MAX_BUNDLE_JOBS} jobs in one bundle", field="jobs")
    return ids


@router.get(
    "",
    response_class=Response,
    responses={
        200: {"content": {"application/zip": {}}, "description": "submission.zip for gluebenchmark.com"},
        404: {"model": ErrorResponse},  # a job of the list: the path has no id for the shared 404
    },
)
def read_submission(
    session: SessionDep,
    principal: PrincipalDep,
    jobs: Annotated[list[str], Query(description="Job ids, comma-separated or repeated")],
    allow_partial: Annotated[bool, Query(description="Bundle even when tasks are missing")] = False,
) -> Response:
    """The GLUE submission zip of these jobs' do_predict files: each task exactly once.

    422 (naming them) when a task is answered twice or, unless allow_partial, missing; when a job has
    no task or no prediction files.
    """
    found = [
        jobs_repo.get_job(session, job_id=job_id, owner=principal.owner_filter)
        for job_id in parse_job_ids(jobs)
    ]
    archive = bundle_submission(
        [JobFiles(j.id, j.spec.get("task_name"), str(j.status), j.output_dir) for j in found],
        allow_partial=allow_partial,
    )
    return Response(
        archive,
        media_type="application/zip",
        headers={"Content-Disposition": 'attachment; filename="submission.zip"'},
    )
