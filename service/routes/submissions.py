"""/v1/submissions: several jobs' GLUE prediction files bundled into the zip GLUE's site accepts."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import WithJsonSchema

from service.deps import MAX_ROW_ID, PrincipalDep, SessionDep, SettingsDep, StoreDep
from service.files.downloads import folder_of
from service.files.job_folders import JobFolder
from service.schemas.common import ErrorResponse
from shared import jobs_repo
from shared.core.errors import InvalidRequest, quote
from shared.research.glue_submission import JobFiles, bundle_submission

router = APIRouter(prefix="/submissions", tags=["submissions"])

MAX_BUNDLE_JOBS = 20
# More comma-separated parts than this is not a list of at most MAX_BUNDLE_JOBS ids, even with repeats.
MAX_LISTED_PARTS = 10 * MAX_BUNDLE_JOBS
# One value of `jobs`, as the schema documents it: ASCII digits, comma-separated.
JOB_IDS_PATTERN = r"^ *[0-9]{1,19}( *, *[0-9]{1,19})* *$"


def parse_job_ids(values: list[str]) -> list[int]:
    """`jobs=1,2,3` or `jobs=1&jobs=2`: job ids (ASCII digits), in the order given, each once.

    One pass, and it stops at the first part too many: the work is bounded whatever the query holds.
    """
    ids: dict[int, None] = {}  # ordered, with O(1) membership
    parts = 0
    for value in values:
        for raw in value.split(",", MAX_LISTED_PARTS):
            part = raw.strip()
            if not part:
                continue
            parts += 1
            if parts > MAX_LISTED_PARTS:
                raise InvalidRequest(f"at most {MAX_BUNDLE_JOBS} jobs in one bundle", field="jobs")
            # isdigit() alone also takes "²" (which int() refuses) and "١" (which int() reads as 1).
            if (
                not (part.isascii() and part.isdigit() and len(part) <= 19)
                or not 1 <= int(part) <= MAX_ROW_ID
            ):
                raise InvalidRequest(f"{quote(part)} is not a job id", field="jobs")
            ids[int(part)] = None
            if len(ids) > MAX_BUNDLE_JOBS:
                raise InvalidRequest(f"at most {MAX_BUNDLE_JOBS} jobs in one bundle", field="jobs")
    if not ids:
        raise InvalidRequest("name the jobs to bundle: jobs=1,2,3", field="jobs")
    return list(ids)


def _read(folder: JobFolder, name: str) -> bytes | None:
    """A file at the top of a job's folder (a GLUE submission file), or None."""
    if folder.kind(name) != "file":
        return None
    return folder.read(name)  # one retried request: never a file object's reads outside the retry


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
    settings: SettingsDep,
    store: StoreDep,
    jobs: Annotated[
        # Documented with its pattern, checked by parse_job_ids (whose errors name the field `jobs`).
        list[Annotated[str, WithJsonSchema({"type": "string", "pattern": JOB_IDS_PATTERN})]],
        Query(description="Job ids, comma-separated or repeated"),
    ],
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
        [
            JobFiles(
                j.id, j.spec.get("task_name"), str(j.status), partial(_read, folder_of(settings, store, j.id))
            )
            for j in found
        ],
        allow_partial=allow_partial,
    )
    return Response(
        archive,
        media_type="application/zip",
        headers={"Content-Disposition": 'attachment; filename="submission.zip"'},
    )
